"""An export read through the mean (an MLM-only run's) loads in sentence-transformers as it is (issue 40, item 6),
giving bertkit's own mean over the tokens; an NSP run's export, read through [CLS], carries no such files."""
import pytest

from tests.helpers import tiny_run

sentence_transformers = pytest.importorskip("sentence_transformers")


def test_an_mlm_only_export_is_a_sentence_transformer(tmp_path, clean_dist_env):
    import torch

    from bertkit.models import load_pretrained
    from bertkit.models.bert import mean_over_tokens
    from bertkit.pretrain import export
    from bertkit.tokenization import load_tokenizer

    _, run = tiny_run(tmp_path, objective="mlm")
    out = export(run, tmp_path / "export")
    st = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    sentences = ["w1 w2 w3 w4", "w5 w6", "w7 w8 w9 w10 w11 w12"]
    got = st.encode(sentences, convert_to_tensor=True)

    model, tok = load_pretrained(out, head=None), load_tokenizer(out)
    tok.no_padding()
    want = []
    with torch.no_grad():
        for s in sentences:
            ids = torch.tensor([tok.encode(s).ids])
            h = model(ids, torch.zeros_like(ids), torch.ones_like(ids)).last_hidden_state
            want.append(mean_over_tokens(h, torch.ones_like(ids))[0])
    assert got.shape == (3, model.cfg.hidden_size)
    torch.testing.assert_close(got, torch.stack(want), atol=1e-5, rtol=1e-4)


def test_an_nsp_export_is_not_offered_as_one(tmp_path, clean_dist_env):
    from bertkit.pretrain import export

    _, run = tiny_run(tmp_path)
    out = export(run, tmp_path / "export")
    assert not (out / "modules.json").exists() and not (out / "1_Pooling").exists()


def test_a_modernbert_export_is_a_sentence_transformer_and_transformers_reads_its_tokenizer(tmp_path,
                                                                                           clean_dist_env):
    """A ModernBERT run whose tokenizer is a vocab.txt alone: the export gains the tokenizer.json transformers needs
    for this family, AutoTokenizer + the model read it, and SentenceTransformer gives bertkit's own mean."""
    import torch
    import transformers

    from bertkit.models import load_pretrained
    from bertkit.pretrain import export
    from bertkit.tokenization import load_tokenizer

    _, run = tiny_run(tmp_path, model="modernbert-tiny", objective="mlm", micro_batch=4)
    out = export(run, tmp_path / "export")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("w1 w2 w3")["input_ids"] == load_tokenizer(out).encode("w1 w2 w3").ids
    got = sentence_transformers.SentenceTransformer(str(out), device="cpu").encode(["w1 w2 w3 w4", "w5 w6"],
                                                                                  convert_to_tensor=True)
    model = load_pretrained(out, head=None)
    want = []
    with torch.no_grad():
        for s in ("w1 w2 w3 w4", "w5 w6"):
            ids = torch.tensor([tok(s)["input_ids"]])
            want.append(model(ids, attention_mask=torch.ones_like(ids)).mean(1)[0])  # the bare encoder: (B, S, H)
    torch.testing.assert_close(got, torch.stack(want), atol=1e-5, rtol=1e-4)
