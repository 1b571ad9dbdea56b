"""The sentence-transformers files beside an export that classifiers read through the mean (an MLM-only run's, such
as `--recipe budget`'s or ModernBERT's): `SentenceTransformer(folder)` then loads the folder as it is, the encoder
(transformers' AutoModel) followed by mean pooling over the tokens, the vector `finetune --pooling mean` reads."""
from pathlib import Path

from bertkit.fileio import atomic_write_json

POOLING_FOLDER = "1_Pooling"


def write_sentence_transformers_files(out_dir, hidden_size: int, max_seq_length: int) -> None:
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": POOLING_FOLDER, "type": "sentence_transformers.models.Pooling"}])
    # the tokenizer files carry the casing rule: sentence-transformers lowercases nothing itself
    atomic_write_json(out_dir / "sentence_bert_config.json", {"max_seq_length": max_seq_length,
                                                             "do_lower_case": False})
    (out_dir / POOLING_FOLDER).mkdir(exist_ok=True)
    atomic_write_json(out_dir / POOLING_FOLDER / "config.json", {
        "word_embedding_dimension": hidden_size, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True})
