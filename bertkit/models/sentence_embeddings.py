"""The sentence-transformers files beside a model folder: `SentenceTransformer(folder)` then loads the folder as it
is, the encoder (transformers' AutoModel) followed by a pooling over the tokens (an export's: the mean, the vector
`finetune --pooling mean` reads; a `finetune embed` model's: the pooling it trained with) and, when asked, unit
length."""
from pathlib import Path

from bertkit.fileio import atomic_write_json

POOLING_FOLDER, NORMALIZE_FOLDER = "1_Pooling", "2_Normalize"
POOLING_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                 "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


def write_sentence_transformers_files(out_dir, hidden_size: int, max_seq_length: int,
                                      pooling: str = "pooling_mode_mean_tokens", normalize: bool = False) -> None:
    out_dir = Path(out_dir)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_FOLDER, "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_FOLDER,
                        "type": "sentence_transformers.models.Normalize"})
        (out_dir / NORMALIZE_FOLDER).mkdir(exist_ok=True)
    atomic_write_json(out_dir / "modules.json", modules)
    # the tokenizer files carry the casing rule: sentence-transformers lowercases nothing itself
    atomic_write_json(out_dir / "sentence_bert_config.json", {"max_seq_length": max_seq_length,
                                                             "do_lower_case": False})
    (out_dir / POOLING_FOLDER).mkdir(exist_ok=True)
    atomic_write_json(out_dir / POOLING_FOLDER / "config.json", {
        "word_embedding_dimension": hidden_size,
        **{mode: mode == pooling for mode in POOLING_MODES}, "include_prompt": True})
