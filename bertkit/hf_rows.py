"""🤗 datasets where a command reads rows from a file (`finetune classify --train-file/--dev-file`, `finetune embed
--pairs`, `encode` with `--text-field`): a `save_to_disk` folder (a DatasetDict's split: its subfolder,
`saved/validation`), or `hf:NAME:SPLIT` (`hf:NAME:CONFIG:SPLIT`) through `datasets.load_dataset`, from the cache it
keeps (HF_DATASETS_OFFLINE=1: the cache alone). Each row is a dict of its columns, numbered from 1 as a file's lines
are in messages."""
from pathlib import Path

from bertkit.errors import DataError


def is_dataset(spec) -> bool:
    """An hf: name, or a folder save_to_disk wrote."""
    path = Path(str(spec))
    return str(spec).startswith("hf:") or (path.is_dir() and any(
        (path / name).is_file() for name in ("state.json", "dataset_dict.json")))


def _datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("reading a 🤗 dataset needs the datasets library: pip install 'bertkit[hf]'") from None
    return datasets


def load_rows(spec):
    """The dataset a spec names (a datasets.Dataset)."""
    datasets = _datasets()
    if str(spec).startswith("hf:"):
        parts = str(spec)[3:].split(":")
        if len(parts) not in (2, 3) or not all(parts):
            raise DataError(f"{spec}: name a Hub dataset as hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT (hf:nsmc:test)")
        name, config, split = parts[0], (parts[1] if len(parts) == 3 else None), parts[-1]
        try:
            return datasets.load_dataset(name, config, split=split)
        except Exception as e:   # the library says what is missing: the split, the config, the network, the cache
            raise DataError(f"{spec}: {type(e).__name__}: {e}") from None
    found = datasets.load_from_disk(str(spec))
    if isinstance(found, datasets.DatasetDict):
        raise DataError(f"{spec}: a 🤗 DatasetDict; give one of its splits' folders: "
                        f"{', '.join(str(Path(spec) / s) for s in found)}")
    return found


def dataset_records(spec):
    """(row number from 1, {column: value}) of every row."""
    for number, row in enumerate(load_rows(spec), 1):
        yield number, row


def dataset_texts(spec, column: str) -> list[str]:
    """One column of texts, every row's (a missing column or a row that is no text: named)."""
    rows = load_rows(spec)
    if column not in rows.column_names:
        raise DataError(f"{spec}: no column {column!r}; its columns: {', '.join(rows.column_names)}")
    texts = rows[column]
    bad = next((i for i, t in enumerate(texts, 1) if not isinstance(t, str)), None)
    if bad is not None:
        raise DataError(f"{spec}: row {bad}'s {column!r} is {texts[bad - 1]!r}, not a text")
    return texts
