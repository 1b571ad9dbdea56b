"""Every reader of user files, given any bytes, either parses them or raises bertkit's own error naming the file
(and the line or field where it can); never another exception (hypothesis, property-based). The corpus readers
never raise at all: a bad file is recorded as that file's error, and a bug would show as an "internal error".

Inputs per reader in `make test`: 1,000 (FUZZ_EXAMPLES; the model folder a third of that, each loads torch), under a
minute in all; more with BERTKIT_FUZZ_EXAMPLES=20000. Random bytes, and random documents of the right shape with
fields deleted, retyped or cut (the structured strategies below), compressed or cut short for the corpus readers."""
import json
import os
import shutil
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bertkit.errors import DataError
from bertkit.finetune.classify import read_table
from bertkit.finetune.korean import (
    KLUE_NER_TAGS,
    NLI_LABELS,
    TASKS,
    check_labels,
    check_pairs,
    read_examples,
    read_klue_ner,
)
from bertkit.finetune.ner import read_conll
from bertkit.finetune.squad import SquadFormatError, read_squad
from bertkit.formats import FormatError, read_corpus_manifest, read_instances_manifest, read_tokenizer_manifest
from bertkit.tokenization import TokenizerError, load_tokenizer

FUZZ_EXAMPLES = int(os.environ.get("BERTKIT_FUZZ_EXAMPLES", "1000"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 200), st.floats(allow_nan=False), text)
json_value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(text, inner, max_size=3)), max_leaves=12)


def squad_like():
    """SQuAD's own shape with any field possibly replaced by any JSON value or missing."""
    def maybe(strategy):
        return st.one_of(strategy, json_value)

    answer = st.fixed_dictionaries({}, optional={"text": maybe(text), "answer_start": maybe(st.integers(-2, 50))})
    qa = st.fixed_dictionaries({}, optional={"id": maybe(text), "question": maybe(text), "is_impossible": scalar,
                                             "answers": maybe(st.lists(maybe(answer), max_size=2))})
    paragraph = st.fixed_dictionaries({}, optional={"context": maybe(text), "qas": maybe(st.lists(maybe(qa),
                                                                                                  max_size=2))})
    article = st.fixed_dictionaries({}, optional={"title": scalar,
                                                  "paragraphs": maybe(st.lists(maybe(paragraph), max_size=2))})
    return st.fixed_dictionaries({}, optional={"data": maybe(st.lists(maybe(article), max_size=2)),
                                               "version": scalar}).map(lambda d: json.dumps(d).encode())


_ROOT = Path(tempfile.mkdtemp(prefix="bertkit-fuzz-"))


def write(data: bytes, name: str) -> Path:
    """`data` as the only file of a fresh folder (the previous example's folder is removed)."""
    shutil.rmtree(_ROOT, ignore_errors=True)
    _ROOT.mkdir()
    path = _ROOT / name
    path.write_bytes(data)
    return path


def names_the_file(error: Exception, path: Path) -> bool:
    return str(path) in str(error) or path.name in str(error)


@FUZZ
@given(st.one_of(st.binary(max_size=300), squad_like()), st.booleans())
def test_squad_json(data, training):
    path = write(data, "train.json")
    try:
        read_squad(path, training=training, version_2=True)
    except SquadFormatError as e:
        assert names_the_file(e, path), e


tsv_text = st.lists(st.lists(st.text(alphabet=string.printable + "é한\u00a0", max_size=12), max_size=4),
                    max_size=6).map(lambda rows: "\n".join("\t".join(r) for r in rows).encode())


@FUZZ
@given(st.one_of(st.binary(max_size=300), tsv_text), st.sampled_from([".tsv", ".csv", ".jsonl"]),
       st.booleans())
def test_classification_table(data, suffix, with_label):
    path = write(data, "train" + suffix)
    try:
        read_table(path, "sentence", label="label" if with_label else None)
    except DataError as e:
        assert names_the_file(e, path), e


conll_text = st.lists(st.one_of(st.just(""), st.just("-DOCSTART- -X- -X- O"),
                                st.lists(st.sampled_from(["EU", "B-ORG", "I-PER", "O", "NNP", "x", "B-", ""]),
                                         max_size=5).map(" ".join)), max_size=12).map(lambda ls: "\n".join(ls).encode())


@FUZZ
@given(st.one_of(st.binary(max_size=300), conll_text))
def test_conll(data):
    path = write(data, "train.txt")
    try:
        read_conll(path)
    except DataError as e:
        assert names_the_file(e, path), e


manifest_like = st.one_of(st.binary(max_size=200), json_value.map(lambda v: json.dumps(v).encode()),
                          st.dictionaries(st.sampled_from(["stage", "complete", "shards", "files", "vocab_size",
                                                           "mode", "objective", "max_seq_length"]), json_value)
                          .map(lambda d: json.dumps(d).encode()))


@FUZZ
@given(manifest_like, st.sampled_from([read_corpus_manifest, read_tokenizer_manifest, read_instances_manifest]))
def test_manifests(data, reader):
    path = write(data, "manifest.json")
    try:
        reader(path.parent)
    except FormatError as e:
        assert names_the_file(e, path) or str(path.parent) in str(e), e


vocab_like = st.one_of(st.binary(max_size=200), st.lists(st.one_of(st.sampled_from(
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "##a", "the", ""]), text), max_size=12)
    .map(lambda ts: "\n".join(ts).encode()))


@FUZZ
@given(vocab_like, st.one_of(st.none(), st.binary(max_size=120), json_value.map(lambda v: json.dumps(v).encode())))
def test_tokenizer_folder(vocab, tokenizer_json):
    folder = write(vocab, "vocab.txt").parent
    if tokenizer_json is not None:
        (folder / "tokenizer.json").write_bytes(tokenizer_json)
    try:
        load_tokenizer(folder)
    except TokenizerError as e:
        assert str(folder) in str(e), e


@pytest.fixture(scope="module")
def corpus_options():
    from dataclasses import asdict

    from bertkit.pipelines.prepare_corpus import CorpusConfig

    return asdict(CorpusConfig(progress=False, min_chars=1))


jsonl_like = st.lists(st.one_of(json_value.map(json.dumps), text), max_size=6).map(lambda ls: "\n".join(ls).encode())
wiki_like = st.lists(st.one_of(st.just('<doc id="1" title="T">'), st.just("</doc>"), text), max_size=8).map(
    lambda ls: "\n".join(ls).encode())


def compress(data: bytes, how: str) -> bytes:
    import bz2
    import gzip
    import lzma

    import zstandard

    return {"": lambda d: d, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
            ".zst": lambda d: zstandard.ZstdCompressor().compress(d)}[how](data)


@FUZZ
@given(st.one_of(st.binary(max_size=300), jsonl_like, wiki_like), st.sampled_from([".txt", ".jsonl", ".parquet",
                                                                                    ".arrow", ""]),
       st.sampled_from(["", ".gz", ".bz2", ".xz", ".zst"]), st.booleans(), st.integers(0, 40))
def test_corpus_files(corpus_options, data, suffix, compression, well_formed, cut):
    """Any file prepare-corpus may be given: read, or this file's error recorded; never an internal error."""
    from bertkit.pipelines.prepare_corpus import process_file

    packed = compress(data, compression) if well_formed else data
    if cut and len(packed) > cut:  # a truncated download
        packed = packed[:-cut]
    path = write(packed, "input" + suffix + compression)
    stats = process_file(0, str(path), path.name, corpus_options, str(path.parent / "part.arrow"))
    assert not (stats["error"] or "").count("internal error"), stats["error"]
    if stats["error"]:
        assert stats["error"].startswith(path.name), stats["error"]


korean_tsv = st.tuples(st.sampled_from(["id\tdocument\tlabel", "sentence1\tsentence2\tscore",
                                        "premise\thypothesis\tgold_label", "genre\tfilename\tyear", ""]),
                       tsv_text).map(lambda t: t[0].encode() + b"\n" + t[1])
def retyped(strategy):
    return st.one_of(strategy, strategy, json_value)  # the right type two times in three


nli_example = st.fixed_dictionaries({"premise": retyped(text), "hypothesis": retyped(text),
                                     "gold_label": retyped(st.sampled_from(list(NLI_LABELS)))}, optional={"guid": text})
sts_example = st.fixed_dictionaries({"sentence1": retyped(text), "sentence2": retyped(text), "labels": retyped(
    st.fixed_dictionaries({"label": retyped(st.floats(0, 5)), "binary-label": retyped(st.sampled_from([0, 1]))}))})
klue_example = st.one_of(nli_example, sts_example, st.dictionaries(text, json_value, max_size=3))
klue_json = st.lists(st.one_of(klue_example, klue_example, json_value), max_size=3).map(
    lambda rows: json.dumps(rows).encode())


@FUZZ
@given(st.one_of(st.binary(max_size=300), korean_tsv, klue_json), st.sampled_from([".tsv", ".txt", ".json"]))
def test_korean_task_file(data, suffix):
    """NSMC, KorNLI, KorSTS (TSV) and KLUE-NLI / KLUE-STS (JSON) files, as `finetune korean` reads and checks them."""
    path = write(data, "task" + suffix)
    try:
        examples = read_examples(path)
        assert all(isinstance(t, str) for ex in examples for t in (ex.text_a, ex.text_b or "")), examples
        for task in ("nsmc", "klue-nli", "klue-sts"):
            check_pairs(examples, task, path)
            check_labels(examples, TASKS[task].labels, path)
    except DataError as e:
        assert names_the_file(e, path), e


char_and_tag = st.tuples(st.sampled_from(list("한국 a\t")), st.sampled_from(list(KLUE_NER_TAGS) + ["B-X", ""]))
klue_ner_line = st.one_of(st.just("## klue-ner-v1.1_dev_00001\t<한국:LC>"), st.just("## note"), st.just(""),
                          char_and_tag.map("\t".join), text)
klue_ner_text = st.lists(klue_ner_line, max_size=10).map(lambda ls: "\n".join(ls).encode())


@FUZZ
@given(st.one_of(st.binary(max_size=300), klue_ner_text))
def test_klue_ner(data):
    path = write(data, "klue-ner.tsv")
    try:
        read_klue_ner(path)
    except DataError as e:
        assert names_the_file(e, path), e


def test_the_fuzzers_cover_every_reader():
    """A reminder with teeth: a reader added to the project gets a fuzzer here (README, Faults)."""
    fuzzers = {name for name in globals() if name.startswith("test_") and name != "test_the_fuzzers_cover_every_reader"}
    assert fuzzers == {"test_squad_json", "test_classification_table", "test_conll", "test_manifests",
                       "test_tokenizer_folder", "test_corpus_files", "test_model_folder", "test_korean_task_file",
                       "test_klue_ner"}


model_config_like = st.one_of(st.binary(max_size=150), json_value.map(lambda v: json.dumps(v).encode()),
                              st.fixed_dictionaries({}, optional={
                                  "model_type": st.sampled_from(["bert", "electra", "megatron-bert", "gpt2"]),
                                  "vocab_size": st.one_of(st.integers(-1, 50), json_value),
                                  "hidden_size": st.one_of(st.sampled_from([8, 16, 0, 7]), json_value),
                                  "num_hidden_layers": st.one_of(st.integers(0, 2), json_value),
                                  "num_attention_heads": st.one_of(st.integers(0, 3), json_value),
                                  "intermediate_size": st.one_of(st.integers(1, 32), json_value)})
                              .map(lambda d: json.dumps(d).encode()))


@settings(max_examples=max(50, FUZZ_EXAMPLES // 3), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(model_config_like, st.binary(max_size=200), st.booleans())
def test_model_folder(config, weights, with_vocab):
    """What fill-mask, finetune and --init-from load: config.json, model.safetensors, the tokenizer files."""
    from bertkit.models import ModelFolderError, load_pretrained

    folder = write(config, "config.json").parent
    (folder / "model.safetensors").write_bytes(weights)
    if with_vocab:
        (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    try:
        load_pretrained(folder)
    except (ModelFolderError, FormatError) as e:
        assert str(folder) in str(e), e
