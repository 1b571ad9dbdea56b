"""🤗 datasets in and out: a save_to_disk folder (a Dataset, a DatasetDict's split) becomes a corpus from its Arrow
files, its metadata never read as text; every stage's Arrow output loads with datasets as it is."""
import json

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.formats import corpus_shards, read_corpus_manifest

datasets = pytest.importorskip("datasets", reason="datasets (the dev extra) is not installed")

TEXTS = [f"문서 {i}번은 여러 문장으로 되어 있다. 두 번째 문장도 충분히 길게 쓴다. The third sentence is English {i}."
         for i in range(60)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    data = datasets.Dataset.from_dict({"text": TEXTS, "title": [f"t{i}" for i in range(60)], "n": list(range(60))})
    data.save_to_disk(str(root / "ds"), num_shards=2)
    datasets.DatasetDict({"train": data.select(range(40)), "test": data.select(range(40, 60))}).save_to_disk(
        str(root / "dd"))
    return root


def prepare(args, out):
    return CliRunner().invoke(main, ["prepare-corpus", *map(str, args), "--out", str(out), "--holdout", "0",
                                     "--min-chars", "10", "--no-progress"])


def titles(out) -> list:
    import pyarrow as pa

    return [t for p in corpus_shards(out) for t in pa.ipc.open_file(str(p)).read_all().column("title").to_pylist()]


def test_a_saved_dataset_is_its_rows_in_order(saved, tmp_path):
    r = prepare([saved / "ds"], tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert titles(tmp_path / "out") == [f"t{i}" for i in range(60)]
    manifest = read_corpus_manifest(tmp_path / "out")
    assert not any(v for k, v in manifest.dropped.items()), manifest.dropped   # no metadata line read as text
    assert {p.rsplit("/", 1)[-1] for p in manifest.skipped_files} == {"state.json", "dataset_info.json"}
    assert "a 🤗 dataset's metadata" in r.output


def test_a_dataset_dicts_split(saved, tmp_path):
    assert prepare([saved / "dd"], tmp_path / "train").exit_code == 0
    assert titles(tmp_path / "train") == [f"t{i}" for i in range(40)]
    assert prepare([saved / "dd", "--split", "test"], tmp_path / "test").exit_code == 0
    assert titles(tmp_path / "test") == [f"t{i}" for i in range(40, 60)]
    bad = prepare([saved / "dd", "--split", "dev"], tmp_path / "dev")
    assert bad.exit_code != 0 and "without the split 'dev' (its splits: train, test)" in bad.output


def test_a_hub_dataset_is_read_from_the_cache_load_dataset_keeps(tmp_path, monkeypatch):
    """--hf-dataset: a dataset repository (here a local one: a folder of Parquet files, as the Hub lays them out) read
    through load_dataset into a cache of our own, then from that cache alone (HF_DATASETS_OFFLINE=1); its rows in
    order, its split by --split, a missing one said with the library's words."""
    repo = tmp_path / "korean-webtext" / "data"
    repo.mkdir(parents=True)
    datasets.Dataset.from_dict({"text": TEXTS[:30], "title": [f"t{i}" for i in range(30)]}).to_parquet(
        str(repo / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_dict({"text": TEXTS[30:], "title": [f"t{i}" for i in range(30, 60)]}).to_parquet(
        str(repo / "test-00000-of-00001.parquet"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    name = str(tmp_path / "korean-webtext")
    r = prepare(["--hf-dataset", name], tmp_path / "train")
    assert r.exit_code == 0, r.output
    assert titles(tmp_path / "train") == [f"t{i}" for i in range(30)]
    inputs = read_corpus_manifest(tmp_path / "train").inputs
    assert inputs and all(str(tmp_path / "cache") in str(i) for i in inputs)   # read in place, from the cache
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    r = prepare(["--hf-dataset", name, "--split", "test"], tmp_path / "test")
    assert r.exit_code == 0, r.output
    assert titles(tmp_path / "test") == [f"t{i}" for i in range(30, 60)]
    bad = prepare(["--hf-dataset", name, "--split", "dev"], tmp_path / "dev")
    assert bad.exit_code != 0 and "--hf-dataset" in bad.output and "dev" in bad.output
    none = prepare([], tmp_path / "none")
    assert none.exit_code == 2 and "or --hf-dataset NAME" in none.output


def test_outputs_load_with_datasets(saved, tmp_path):
    from bertkit.formats import read_instances_manifest
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer

    assert prepare([saved / "ds", "--near-dedup", "--languages", "ko,en"], tmp_path / "corpus").exit_code == 0
    corpus = datasets.load_dataset("arrow", data_files=[str(p) for p in corpus_shards(tmp_path / "corpus")],
                                   split="train")
    # the 60 texts differ only in their numbers, which near-duplicates ignore: few clusters, holding them all
    assert sum(corpus["cluster_size"]) == 60 and set(corpus.column_names) >= {"id", "sentences", "language"}
    train_tokenizer(tmp_path / "corpus", tmp_path / "tok", TokenizerConfig(vocab_size=300, progress=False,
                                                                           pretokenize="none"))
    make_instances(tmp_path / "corpus", tmp_path / "tok", tmp_path / "inst", InstancesConfig(max_seq_length=32),
                   progress=False)
    files = [str(tmp_path / "inst" / f) for f in read_instances_manifest(tmp_path / "inst").shard_files("train")]
    instances = datasets.load_dataset("arrow", data_files=files, split="train")
    assert instances.num_rows > 0 and "input_ids" in instances.column_names
    assert json.loads((tmp_path / "corpus" / "manifest.json").read_text())["complete"]


def test_finetune_and_embed_read_a_saved_dataset_as_they_read_its_file(tmp_path):
    """finetune classify on a save_to_disk folder scores as on the same rows in a TSV; embed's pairs read alike; a
    DatasetDict folder names its splits' folders; a bad hf: name says how to write one."""
    from bertkit.embeddings.data import read_pairs
    from bertkit.errors import DataError
    from bertkit.finetune.classify import finetune_classify, read_table
    from bertkit.finetune.train import TrainConfig
    from tests.helpers import tiny_model_folder

    model = tiny_model_folder(tmp_path)
    rows = [{"sentence": f"w{i % 9} w{(i * 7) % 11} w{(i * 3) % 5}", "label": str(i % 2)} for i in range(40)]
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{r['sentence']}\t{r['label']}\n"
                                                                      for r in rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dict"))
    def texts(source):
        return [(e.text_a, e.text_b, e.label) for e in read_table(source, "sentence", label="label")]

    assert texts(tmp_path / "saved") == texts(tmp_path / "train.tsv")

    def scores(source, name):
        summary = finetune_classify(model, source, source, TrainConfig(out_dir=str(tmp_path / name), epochs=1,
                                                                       batch_size=8, save_model=False),
                                    text_a="sentence", label="label", max_seq_length=16)
        return {k: v for k, v in summary["best"].items() if isinstance(v, float) and "second" not in k}

    from_dataset = scores(str(tmp_path / "saved"), "a")
    assert "accuracy" in from_dataset and from_dataset == scores(tmp_path / "train.tsv", "b")
    pairs = [{"anchor": r["sentence"], "positive": r["sentence"][::-1]} for r in rows]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    datasets.Dataset.from_list(pairs).save_to_disk(str(tmp_path / "pairs"))
    assert read_pairs(tmp_path / "pairs") == read_pairs(tmp_path / "pairs.jsonl")
    with pytest.raises(DataError, match="a 🤗 DatasetDict; give one of its splits' folders: .*dict/train"):
        read_table(tmp_path / "dict", "sentence", label="label")
    assert read_table(tmp_path / "dict" / "train", "sentence", label="label")[0].text_a == rows[0]["sentence"]
    with pytest.raises(DataError, match="hf:NAME:SPLIT"):
        read_table("hf:klue", "sentence", label="label")


def test_encode_reads_a_dataset_column_as_it_reads_lines(tmp_path):
    import pyarrow as pa

    from tests.helpers import tiny_model_folder

    model = tiny_model_folder(tmp_path)
    texts = [f"w{i % 9} w{(i * 7) % 11}" for i in range(12)]
    (tmp_path / "lines.txt").write_text("\n".join(texts) + "\n")
    datasets.Dataset.from_dict({"sentence": texts, "n": list(range(12))}).save_to_disk(str(tmp_path / "saved"))
    runs = {}
    for name, args in (("file", [tmp_path / "lines.txt"]), ("dataset", [tmp_path / "saved", "--text-field",
                                                                       "sentence"])):
        r = CliRunner().invoke(main, ["encode", str(model), *map(str, args), "--out", str(tmp_path / f"{name}.arrow")])
        assert r.exit_code == 0, r.output
        runs[name] = pa.ipc.open_file(str(tmp_path / f"{name}.arrow")).read_all().to_pydict()
    assert runs["dataset"]["text"] == texts and runs["dataset"] == runs["file"]
    r = CliRunner().invoke(main, ["encode", str(model), str(tmp_path / "saved"), "--out", str(tmp_path / "x.arrow")])
    assert r.exit_code != 0 and "no column 'text'; its columns: sentence, n" in r.output
