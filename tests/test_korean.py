"""Korean first: the morpheme-aware vocabulary (train-tokenizer --pretokenize mecab|kiwi), messages about Korean
text (legacy encodings with the iconv fix, Hangul in file names), and the Korean quick start in README.ko.md, every
command of which runs here on the Korean Wikipedia sample (a tiny model, a few steps)."""
import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from tests.helpers import BIN, REPO

KO_WIKI = "wikipedia_ko_wikiextractor/text/AA"
pytest.importorskip("mecab", reason="the korean extra (python-mecab-ko) is not installed")
pytest.importorskip("kiwipiepy", reason="the korean extra (kiwipiepy) is not installed")


@pytest.fixture(scope="module")
def ko_corpus(shared_data, tmp_path_factory):
    """A prepare-corpus folder of one file of the Korean sample (about 1 MB), with a held-out split."""
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    out = tmp_path_factory.mktemp("ko") / "corpus"
    prepare_corpus([shared_data / KO_WIKI / "wiki_02"], out, CorpusConfig(holdout=0.05, progress=False, workers=1))
    return out


@pytest.fixture(scope="module")
def vocabularies(ko_corpus):
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer

    return {mode: train_tokenizer(ko_corpus, ko_corpus.parent / f"tok-{mode}",
                                  TokenizerConfig(vocab_size=6000, pretokenize=mode, progress=False))
            for mode in ("none", "mecab", "kiwi")}


def test_auto_takes_kiwi_for_a_korean_corpus_only(ko_corpus, vocabularies, tmp_path, capsys, monkeypatch):
    """--pretokenize auto (the default): a mostly Korean corpus gets kiwi's vocabulary, byte for byte, and is told;
    a corpus of other words gets plain WordPiece; a folder made before with plain WordPiece names the change."""
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
    from bertkit.tokenization import TokenizerError
    from tests.helpers import write_corpus

    auto = train_tokenizer(ko_corpus, tmp_path / "auto", TokenizerConfig(vocab_size=6000, progress=False))
    assert auto.settings["pretokenize"] == "kiwi" and auto.vocab_sha256 == vocabularies["kiwi"].vocab_sha256
    assert "of the corpus' words are Korean, so the vocabulary follows kiwi" in capsys.readouterr().err
    from bertkit.pipelines import korean

    korean.analyser.cache_clear()
    monkeypatch.setitem(sys.modules, "kiwipiepy", None)  # a finished folder is found again without the analyser
    try:
        again = train_tokenizer(ko_corpus, tmp_path / "auto", TokenizerConfig(vocab_size=6000, progress=False))
    finally:
        korean.analyser.cache_clear()
    assert again.vocab_sha256 == auto.vocab_sha256
    monkeypatch.undo()
    english = tmp_path / "english"
    write_corpus(english, [[["the cat sat on the mat", "a dog ran", "대한민국 is a country"]] * 20])
    plain = train_tokenizer(english, tmp_path / "en", TokenizerConfig(vocab_size=200, min_frequency=1,
                                                                      progress=False))
    assert plain.settings["pretokenize"] == "none"
    with pytest.raises(TokenizerError, match=r"tok-none: already holds a tokenizer made from other settings "
                                             r"\(pretokenize: none -> kiwi\)"):
        train_tokenizer(ko_corpus, ko_corpus.parent / "tok-none", TokenizerConfig(vocab_size=6000, progress=False))


def held_out(corpus):
    from bertkit.fileio import read_arrow
    from bertkit.formats import corpus_shards

    return [s for p in corpus_shards(corpus, "holdout") for d in read_arrow(p).column("sentences").to_pylist()
            for s in d]


def test_morpheme_aware_vocabulary_follows_morphemes_and_reads_raw_text(ko_corpus, vocabularies):
    from transformers import AutoTokenizer

    from bertkit.pipelines.korean import crossing_share
    from bertkit.tokenization import load_tokenizer

    sentences = held_out(ko_corpus)
    share = {mode: crossing_share(load_tokenizer(ko_corpus.parent / f"tok-{mode}"), sentences, "mecab")
             ["crossing_share"] for mode in vocabularies}
    # plain WordPiece cuts through morphemes often; trained on MeCab's morphemes it almost never does
    assert share["mecab"] < share["none"] / 4 and share["kiwi"] < share["none"] / 2
    for mode in ("mecab", "kiwi"):
        m = vocabularies[mode]
        assert m.settings["pretokenize"] == mode and m.stats["unk_word_rate"] <= vocabularies["none"].stats[
            "unk_word_rate"] + 0.001
        folder = ko_corpus.parent / f"tok-{mode}"
        ours = load_tokenizer(folder)
        # the particles are continuation pieces of their own: the noun and 의/는/를 come apart
        assert ours.encode("대한민국의", add_special_tokens=False).tokens == ["대한민국", "##의"]
        # raw text in, the same ids from tokenizers and from transformers (no analyser at tokenization time)
        hf = AutoTokenizer.from_pretrained(str(folder))
        for s in sentences[:200]:
            assert hf(s)["input_ids"] == ours.encode(s).ids


def test_the_alphabet_needs_no_analyser(ko_corpus):
    """What lets train-tokenizer run the analyser on the sampled text only: the analyser's alphabet is the plain
    one plus "#" and "###" (its "##piece" spelling), as a cut only splits a word."""
    from bertkit.formats import corpus_shards
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, _run_trainer
    from bertkit.tokenization import SPECIAL_TOKENS

    def alphabet(mode):
        config = TokenizerConfig(pretokenize=mode, strip_accents="none", lowercase=False, progress=False)
        shards = corpus_shards(ko_corpus, "train")
        return set(_run_trainer(shards, config, len(SPECIAL_TOKENS), list(SPECIAL_TOKENS), "")[len(SPECIAL_TOKENS):])
    assert alphabet("kiwi") == alphabet("none") | {"#", "###"}


def test_the_analyser_reads_only_the_sample(ko_corpus, tmp_path, monkeypatch):
    import bertkit.pipelines.train_tokenizer as tt
    from bertkit.formats import read_corpus_manifest

    seen, real = [], tt.training_words
    monkeypatch.setattr(tt, "training_words", lambda s, *a: seen.append(s) or real(s, *a))
    total = read_corpus_manifest(ko_corpus).totals
    sentences = total["sentences"]  # train and held-out
    tt.train_tokenizer(ko_corpus, tmp_path / "tok", tt.TokenizerConfig(
        vocab_size=6000, pretokenize="kiwi", sample_bytes=200_000, progress=False, stats_sentences=0))
    assert 0 < len(seen) < sentences / 2


def test_a_missing_analyser_says_how_to_install_it(ko_corpus, tmp_path, monkeypatch):
    from bertkit.pipelines import korean

    korean.analyser.cache_clear()
    monkeypatch.setitem(sys.modules, "mecab", None)  # import mecab now fails
    try:
        r = CliRunner().invoke(main, ["train-tokenizer", str(ko_corpus), "--out", str(tmp_path / "t"),
                                      "--pretokenize", "mecab", "--no-progress"])
    finally:
        korean.analyser.cache_clear()
    assert r.exit_code == 1 and "pip install 'bertkit[korean]'" in r.output and "Traceback" not in r.output
    korean.analyser.cache_clear()
    monkeypatch.setitem(sys.modules, "kiwipiepy", None)  # the default, auto, takes kiwi for a Korean corpus
    try:
        r = CliRunner().invoke(main, ["train-tokenizer", str(ko_corpus), "--out", str(tmp_path / "t"),
                                      "--no-progress"])
    finally:
        korean.analyser.cache_clear()
    assert r.exit_code == 1 and "pip install 'bertkit[korean]'" in r.output and "Traceback" not in r.output
    assert "--pretokenize auto chose kiwi for this Korean corpus; --pretokenize none trains plain" in r.output
    assert not (tmp_path / "t" / "vocab.txt").exists()


def test_korean_legacy_encodings_and_hangul_file_names(tmp_path):
    """A CP949 (or EUC-KR) file named in Hangul: both stages name it and give the iconv command, and the
    converted file then works."""
    text = "대한민국의 수도는 서울이다. 한국어는 한글로 적는다. 이 문장들은 최소 길이를 넘기 위해 조금 더 길게 쓴다.\n"
    corpus_file = tmp_path / "말뭉치.txt"
    corpus_file.write_bytes(text.encode("cp949"))
    r = CliRunner().invoke(main, ["prepare-corpus", str(corpus_file), "--out", str(tmp_path / "c"), "--no-progress"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "말뭉치.txt: is CP949/EUC-KR (Korean Windows) text, not UTF-8; convert it first: iconv -f CP949 -t " \
           "UTF-8 말뭉치.txt > 말뭉치.utf8.txt" in r.output
    subprocess.run(f"iconv -f CP949 -t UTF-8 {corpus_file} > {tmp_path / '말뭉치.utf8.txt'}", shell=True, check=True)
    r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "말뭉치.utf8.txt"), "--out",
                                  str(tmp_path / "c2"), "--no-progress"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "c2" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["inputs"][0]["source"] == "말뭉치.utf8.txt" and manifest["totals"]["documents"] == 1

    table = tmp_path / "훈련.tsv"
    table.write_bytes("문장\t라벨\n영화가 재미있었다\t1\n지루했다\t0\n".encode("euc-kr"))
    from bertkit.errors import DataError
    from bertkit.finetune.classify import read_table

    with pytest.raises(DataError, match="훈련.tsv:1: is CP949/EUC-KR .* iconv -f CP949 -t UTF-8 훈련.tsv > "
                                        "훈련.utf8.tsv"):
        read_table(table, "문장", label="라벨")
    from bertkit.finetune.korean import read_examples, read_klue_ner
    from bertkit.finetune.squad import SquadFormatError, read_squad

    for name, text, read, error in (  # every Korean task's reader says so too, with the line
            ("nsmc.txt", "id\tdocument\tlabel\n1\t재미있다\t1\n", read_examples, DataError),
            ("klue-nli.json", '[{"premise": "비가 온다"}]', read_examples, DataError),
            ("klue-ner.tsv", "## klue-ner-v1.1_dev_00000\t<서울:LC>\n서\tB-LC\n", read_klue_ner, DataError),
            ("korquad.json", '{"data": [],\n "title": "한국어"}', lambda p: read_squad(p, training=False),
             SquadFormatError)):
        (tmp_path / name).write_bytes(text.encode("cp949"))
        line = text[: next(i for i, c in enumerate(text) if ord(c) > 127)].count("\n") + 1
        with pytest.raises(error, match=rf"{name}:{line}: is CP949/EUC-KR .* iconv -f CP949 -t UTF-8 {name} > "):
            read(tmp_path / name)


def quickstart_block() -> str:
    text = (REPO / "README.ko.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return next(b for b in blocks if "bertkit prepare-corpus" in b)


@pytest.mark.slow
def test_the_korean_quick_start_runs_as_written(shared_data, tmp_path):
    """Every command of README.ko.md's quick start, as written, on one file of the Korean sample with a tiny
    model and 30 steps (the block's variables carry the sizes)."""
    script = quickstart_block()
    assert all(flag in script for flag in ("--splitter kss", "fill-mask", "finetune classify"))
    (tmp_path / "ko").mkdir()
    (tmp_path / "ko" / "wiki_02").symlink_to(shared_data / KO_WIKI / "wiki_02")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PATH=f"{BIN}:{env['PATH']}", KO=str(tmp_path / "ko"), OUT=str(tmp_path / "out"), MODEL="tiny",
               TIME="20s", VOCAB="6000", SENTENCES="300", EPOCHS="1", OMP_NUM_THREADS="2")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert json.loads((out / "tokenizer" / "manifest.json").read_text())["settings"]["pretokenize"] == "kiwi"
    assert json.loads((out / "corpus" / "manifest.json").read_text())["options"]["splitter"] == "kss"
    assert "대한민국의 수도는 [MASK]이다." in done.stdout and re.search(r"^\s+1\. \S+", done.stdout, re.M)
    summary = json.loads((out / "finetune" / "metrics.json").read_text())
    assert summary["task"] == "classify" and "accuracy" in summary["best"]


GOLD = REPO / "benchmarks" / "data" / "ko_sentence_gold.jsonl"


def boundary_f1(rows, split) -> float:
    """Sentence-start offsets (in non-space characters) of a splitter against the hand-annotated gold set."""
    def starts(sentences):
        pos, out = 0, set()
        for s in sentences:
            out.add(pos)
            pos += len(re.sub(r"\s", "", s))
        return out - {0}
    tp = fp = fn = 0
    for r in rows:
        gold, pred = starts(r["sentences"]), starts(split(r["text"]))
        tp, fp, fn = tp + len(gold & pred), fp + len(pred - gold), fn + len(gold - pred)
    return 2 * tp / (2 * tp + fp + fn)


@pytest.mark.parametrize("splitter, at_least", [("kss", 0.95), ("kiwi", 0.89)])
def test_korean_splitters_beat_sentencex_on_the_gold_set(splitter, at_least):
    pytest.importorskip("kss", reason="the korean extra (kss) is not installed")
    from bertkit.pipelines.sentences import split_sentences

    rows = [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines()][::2]  # half: kss is slow
    baseline = boundary_f1(rows, lambda t: split_sentences(t, "ko"))
    korean = boundary_f1(rows, lambda t: split_sentences(t, "ko", splitter))
    assert korean >= at_least and korean > baseline + 0.01, (splitter, korean, baseline)


@pytest.mark.parametrize("splitter, module", [("kss", "kss"), ("kiwi", "kiwipiepy")])
def test_prepare_corpus_splitter_applies_to_korean_documents_only(tmp_path, splitter, module):
    pytest.importorskip(module, reason=f"the korean extra ({module}) is not installed")
    from bertkit.fileio import read_arrow
    from bertkit.formats import corpus_shards, read_corpus_manifest

    ko = "그는 “끝났다.”라고 말했다. 그 뒤 1990년에 서울로 돌아왔다. 그곳에서 연구를 이어갔다."
    en = "He said it was over. Then in 1990 he returned to Seoul. There he went on with his research."
    (tmp_path / "in.txt").write_text(f"{ko}\n\n{en}\n", encoding="utf-8")
    docs = {}
    for name in ("sentencex", splitter):
        out = tmp_path / name
        r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "in.txt"), "--out", str(out), "--holdout", "0",
                                      "--min-chars", "10", "--splitter", name, "--no-progress", "-j", "1"])
        assert r.exit_code == 0, r.output
        docs[name] = [d for p in corpus_shards(out, "train") for d in read_arrow(p).column("sentences").to_pylist()]
        assert read_corpus_manifest(out).options["splitter"] == name
    from bertkit.pipelines.sentences import split_sentences
    # sentencex splits inside the quotation; the Korean splitters keep it whole (the gold set's rule)
    korean = {name: [d for d in found if d[0].startswith("그")] for name, found in docs.items()}
    assert korean[splitter] == [["그는 “끝났다.”라고 말했다.", "그 뒤 1990년에 서울로 돌아왔다.",
                                 "그곳에서 연구를 이어갔다."]]
    assert korean["sentencex"][0][:2] == ["그는 “끝났다.”", "라고 말했다."]
    english = [d for d in docs[splitter] if d[0].startswith("He")]
    assert english == [split_sentences(en, "en")] == [d for d in docs["sentencex"] if d[0].startswith("He")]


def test_a_missing_splitter_says_how_to_install_it(tmp_path, monkeypatch):
    from bertkit.pipelines.sentences import korean_splitter

    (tmp_path / "in.txt").write_text("한국어 문장이다. 두 번째 문장이다.\n", encoding="utf-8")
    korean_splitter.cache_clear()
    monkeypatch.setitem(sys.modules, "kss", None)
    try:
        r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "in.txt"), "--out", str(tmp_path / "c"),
                                      "--splitter", "kss", "--no-progress"])
    finally:
        korean_splitter.cache_clear()
    assert r.exit_code != 0 and "pip install 'bertkit[korean]'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_the_korean_modernbert_block_runs_as_written(shared_data, tmp_path):
    """README.ko.md's ModernBERT block, as written, small: a Korean corpus to a ModernBERT that transformers reads,
    it and its random start fine-tuned and scored on three Korean tasks (the first rows of each, one epoch, one
    rate, two seeds), and the two compared."""
    text = (REPO / "README.ko.md").read_text(encoding="utf-8")
    script = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "--recipe budget" in b)
    (tmp_path / "ko").mkdir()
    (tmp_path / "ko" / "wiki_02").symlink_to(shared_data / KO_WIKI / "wiki_02")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PATH=f"{BIN}:{env['PATH']}", KO=str(tmp_path / "ko"), DATA=str(shared_data), OUT=str(tmp_path / "out"),
               TIME="20s", VOCAB="6000", OMP_NUM_THREADS="2", SEEDS="0,1", ROWS="48",
               FT="--max-dev-rows 48 --epochs 1 --max-seq-length 48 --no-save-model")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "modernbert"
    assert f"transformers reads {out / 'model'}" in done.stdout
    for start in ("random", "model"):
        table = json.loads((out / f"eval-{start}" / "manifest.json").read_text())["tasks"]
        for task, metric in (("nsmc", "accuracy"), ("klue-nli", "accuracy"), ("klue-sts", "pearson")):
            scores = [json.loads((out / f"eval-{start}" / task / f"lr0.001-seed{seed}" / "metrics.json").read_text())
                      ["best"][metric] for seed in (0, 1)]
            assert table[task]["rates"]["0.001"]["mean"] == pytest.approx(sum(scores) / 2)
    import safetensors.torch

    random, trained = (safetensors.torch.load_file(out / m / "model.safetensors") for m in ("random", "model"))
    assert random.keys() == trained.keys() and any(not random[k].equal(trained[k]) for k in random)
    assert re.search(r"^nsmc .*\(.*lr 0\.001\) .*no verdict \(2 paired seed\(s\); 3 needed\)$", done.stdout, re.M), \
        done.stdout[-3000:]   # the block's two seeds: no verdict (--seeds 0,1,2 gives one)
    assert re.search(r"^klue-sts\s+pearson\s", done.stdout, re.M), done.stdout[-3000:]
