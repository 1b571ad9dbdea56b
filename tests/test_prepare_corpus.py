"""prepare-corpus: formats, cleaning, counts, schema, holdout, worker-count identity, resume, bad input, Korean."""
import bz2
import gzip
import hashlib
import json
import lzma
import os
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from click.testing import CliRunner

from bertkit.cli import main as cli
from bertkit.fileio import FolderNotOwnedError, checksum_file, read_arrow
from bertkit.formats import CORPUS_SCHEMA, CorpusError, corpus_shards, read_corpus_manifest
from bertkit.pipelines.prepare_corpus import CorpusConfig, parse_size, prepare_corpus

REPO = Path(__file__).resolve().parents[1]
JAMO = range(0x1100, 0x1200)

WIKI = """<doc id="1" url="http://x/?curid=1" title="Alpha">
Alpha

Alpha is the first letter of the Greek alphabet. It has the value one in the Greek numeral system.
History.
The letter was derived from the Phoenician letter aleph. It was adopted by the Greeks in the 8th century BC.
See also.
References.
</doc>
<doc id="2" url="http://x/?curid=2" title="Beta">
Beta

Beta is the second letter of the <br>Greek alphabet. In the system of Greek numerals it has a value of two.
</dl>
 }}{{
 title="ctx_ver=Z39.88-2004&rft_val_fmt={{urlencode:info:ofi/fmt:kev:mtx:}}{{
class="wikitable succession-box" style="margin:0.5em auto; font-size:95%;clear:both;"
|{{
</doc>
<doc id="3" url="http://x/?curid=3" title="Alpha copy">
Alpha copy

Alpha is the first letter of the Greek alphabet. It has the value one in the Greek numeral system.
History.
The letter was derived from the Phoenician letter aleph. It was adopted by the Greeks in the 8th century BC.
</doc>
<doc id="4" url="http://x/?curid=4" title="Stub">
Stub

Too short to keep!
</doc>
"""
ALPHA = ["Alpha is the first letter of the Greek alphabet.", "It has the value one in the Greek numeral system.",
         "History.", "The letter was derived from the Phoenician letter aleph.",
         "It was adopted by the Greeks in the 8th century BC."]
BETA = ["Beta is the second letter of the Greek alphabet.", "In the system of Greek numerals it has a value of two."]


def cfg(**kw):
    kw.setdefault("progress", False)
    kw.setdefault("holdout", 0.0)
    return CorpusConfig(**kw)


def rows(out, split=None):
    """All documents of a corpus folder, in shard order, through the contract's reader."""
    splits = [split] if split else ["train", "holdout"]
    return [r for s in splits for p in corpus_shards(out, s) for r in read_arrow(p).to_pylist()]


def shard_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(Path(out).glob("*.arrow"))}


def write(path: Path, text: str, opener=open):
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wb") as f:
        f.write(text.encode("utf-8"))
    return path


def synthetic_docs(n, seed=0):
    """n distinct documents of 3 plain sentences each (unambiguous boundaries)."""
    import random

    rnd = random.Random(seed)
    words = "river stone light paper garden window music letter forest winter".split()
    docs = []
    for i in range(n):
        docs.append([f"Document {i} talks about the {rnd.choice(words)} and the {rnd.choice(words)} today.",
                     f"The {rnd.choice(words)} was seen near the {rnd.choice(words)} in year {1000 + i}.",
                     f"Nobody forgot the {rnd.choice(words)} of number {i}."])
    return docs


def as_paragraphs(docs):
    return "\n\n".join(" ".join(d) for d in docs) + "\n"


# ------------------------------------------------------------------------------------------ cleaning and counts

def test_wikiextractor_cleaning_counts_schema(tmp_path):
    src = write(tmp_path / "wiki" / "AA" / "wiki_00", WIKI)
    m = prepare_corpus([tmp_path / "wiki"], tmp_path / "out", cfg(min_chars=40))
    docs = rows(tmp_path / "out")
    # the repeated title line, the empty sections (See also., References.), markup lines (</dl>, template and
    # attribute leftovers) and inline tags (<br>) are gone;
    # the non-empty section title stays; doc 3 is an exact duplicate of doc 1; doc 4 is shorter than --min-chars
    assert [d["sentences"] for d in docs] == [ALPHA, BETA]
    assert [d["title"] for d in docs] == ["Alpha", "Beta"]
    assert {d["source"] for d in docs} == {"wiki/AA/wiki_00"}
    assert docs[0]["id"] == hashlib.sha1("\n".join(ALPHA).encode()).hexdigest()[:16]
    assert m.dropped == {"duplicate": 1, "too_short": 1}
    assert m.removed_lines == {"empty_section": 2, "markup": 5, "repeated_title": 4}
    assert m.totals["documents_read"] == 4 and m.totals["documents"] == 2
    assert m.totals["sentences"] == len(ALPHA) + len(BETA)
    assert m.inputs[0]["bytes"] == src.stat().st_size and m.inputs[0]["format"] == "wikiextractor"
    # the manifest contract, checked against the files themselves
    assert read_corpus_manifest(tmp_path / "out").complete is True
    for entry in m.shards:
        path = tmp_path / "out" / entry.file
        assert entry.checksum == checksum_file(path) and entry.bytes == path.stat().st_size
        assert entry.rows == read_arrow(path).num_rows
        assert read_arrow(path).schema.equals(CORPUS_SCHEMA)
    assert not (tmp_path / "out" / ".work").exists()


def test_cleaning_nfc_controls_whitespace_and_korean(tmp_path):
    korean = "한국어 문장은 음절 단위로 저장되어야 한다. 두 번째 문장도 마찬가지다."
    nfd = unicodedata.normalize("NFD", korean)
    assert any(ord(c) in JAMO for c in nfd)  # the input really is decomposed
    text = f"Tabs\tand  spaces\x0cand\x07 bells are\u00ad cleaned.   Second  sentence here.\n\n{nfd}\n"
    write(tmp_path / "a.txt", text)
    prepare_corpus([tmp_path / "a.txt"], tmp_path / "out", cfg(min_chars=10))
    docs = rows(tmp_path / "out")
    assert docs[0]["sentences"] == ["Tabs and spaces and bells are cleaned.", "Second sentence here."]
    assert docs[1]["sentences"] == ["한국어 문장은 음절 단위로 저장되어야 한다.", "두 번째 문장도 마찬가지다."]
    assert all(unicodedata.is_normalized("NFC", s) for d in docs for s in d["sentences"])


# ------------------------------------------------------------------------------------------ formats

def test_every_format_and_compression_gives_the_same_documents(tmp_path):
    docs = synthetic_docs(12)
    expected = docs
    inputs = {
        "para.txt": as_paragraphs(docs),
        "lines.txt": "\n\n".join("\n".join(d) for d in docs) + "\n",
        "docs.jsonl": "".join(json.dumps({"body": " ".join(d), "title": f"t{i}"}) + "\n" for i, d in enumerate(docs)),
        "docs.csv": "id,title,body\r\n" + "".join(f'{i},t{i},"{" ".join(d)}"\r\n' for i, d in enumerate(docs)),
        "docs.tsv": "title\tbody\tdate\n" + "".join(f"t{i}\t{' '.join(d)}\t2026\n" for i, d in enumerate(docs)),
    }
    for name, text in inputs.items():
        write(tmp_path / "in" / name, text)
        fmt = {"lines.txt": "lines"}.get(name, "auto")
        for suffix, opener in ((".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)):
            write(tmp_path / "in" / (name + suffix), text, opener)
        half = len(text.encode()) // 2  # two zstd frames (as from `cat a.zst b.zst`), cut mid-line
        frames = [zstandard.ZstdCompressor().compress(part) for part in (text.encode()[:half], text.encode()[half:])]
        (tmp_path / "in" / (name + ".zst")).write_bytes(b"".join(frames))
        for variant in sorted((tmp_path / "in").glob(name + "*")):
            out = tmp_path / "out" / variant.name
            prepare_corpus([variant], out, cfg(format=fmt, text_field="body", min_chars=0))
            got = rows(out)
            assert [d["sentences"] for d in got] == expected, variant.name
            if name.startswith("docs."):
                assert [d["title"] for d in got] == [f"t{i}" for i in range(len(docs))]
    table = pa.table({"body": [" ".join(d) for d in docs], "other": list(range(len(docs)))})
    pq.write_table(table, tmp_path / "in" / "t.parquet")
    with pa.OSFile(str(tmp_path / "in" / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pa.OSFile(str(tmp_path / "in" / "s.arrows"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    for name, fmt in (("t.parquet", "auto"), ("t.arrow", "auto"), ("s.arrows", "arrow")):
        out = tmp_path / "out" / name
        m = prepare_corpus([tmp_path / "in" / name], out, cfg(format=fmt, text_field="body", min_chars=0))
        assert [d["sentences"] for d in rows(out)] == expected, name
        assert m.inputs[0]["format"] in ("parquet", "arrow")


def test_a_csv_corpus_is_its_rows_quoted_fields_and_all(tmp_path):
    """Issue 81: a CSV of reviews was read as plain text, one document holding its header, dates and URLs. Each row
    is now a document (RFC 4180: a quoted field holds commas, quotes and line breaks), a row of another width is
    counted and skipped, and a missing column names the header and --text-field."""
    import csv
    import io

    texts = ["Great film, would watch again. The cast was \"superb\".", "Line one of a review.\nLine two of it.",
             "정말 재미있다. 배우들이 좋았다."]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["date", "review", "url"])
    for i, t in enumerate(texts):
        writer.writerow([f"2026-11-0{i + 1}", t, f"https://example.org/{i}"])
    raw = buffer.getvalue() + "2026-11-09,only two fields\r\n"
    write(tmp_path / "reviews.csv", raw)
    m = prepare_corpus([tmp_path / "reviews.csv"], tmp_path / "out", cfg(text_field="review", min_chars=0))
    got = [d["sentences"] for d in rows(tmp_path / "out")]
    assert got == [["Great film, would watch again.", 'The cast was "superb".'],
                   ["Line one of a review.", "Line two of it."], ["정말 재미있다.", "배우들이 좋았다."]]
    assert m.inputs[0]["format"] == "csv" and m.inputs[0]["problems"]["bad_row"] == 1
    assert not any("2026-11" in s or "https" in s for d in got for s in d)
    r = CliRunner().invoke(cli, ["prepare-corpus", str(tmp_path / "reviews.csv"), "--out", str(tmp_path / "o2"),
                                 "--no-progress"])
    assert r.exit_code == 1 and "has no 'text' column (its header: date, review, url)" in r.output, r.output


def test_shards_bounded_ordered_and_loadable_with_datasets(tmp_path):
    docs = synthetic_docs(300)
    write(tmp_path / "a.txt", as_paragraphs(docs[:150]))
    write(tmp_path / "b.txt", as_paragraphs(docs[150:]))
    m = prepare_corpus([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "out",
                       cfg(shard_size=parse_size("4KB"), min_chars=0))
    train = [e for e in m.shards if e.split == "train"]
    assert len(train) > 3 and [e.file for e in train] == [f"shard-{i:05d}.arrow" for i in range(len(train))]
    assert [d["sentences"] for d in rows(tmp_path / "out")] == docs  # input order kept across shards and files
    for e in train[:-1]:  # every shard but the last ends with the row that crosses the size
        texts = read_arrow(tmp_path / "out" / e.file).column("sentences").to_pylist()
        size = sum(len(s.encode()) + 4 for doc in texts for s in doc)
        last = sum(len(s.encode()) + 4 for s in texts[-1])
        assert size - last < 4096 <= size
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("arrow", data_files=[str(p) for p in corpus_shards(tmp_path / "out")],
                               split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 300 and ds[0]["sentences"] == docs[0] and ds.column_names == CORPUS_SCHEMA.names


def test_the_merge_holds_a_batch_not_a_shard(tmp_path, monkeypatch):
    """Shards are streamed to disk as the parts are merged: Arrow's memory after each part stays a batch's, where
    a shard buffered whole (as the merge once did, the holdout split growing with the corpus up to --shard-size)
    would hold all the text merged so far."""
    from bertkit.pipelines import corpus_merge

    docs = synthetic_docs(1600)
    for k in range(8):
        write(tmp_path / f"in{k}.txt", as_paragraphs(docs[k * 200:(k + 1) * 200]))
    held, real_add = [], corpus_merge.Merger.add_part

    def add_part(self, part):
        real_add(self, part)
        held.append(pa.total_allocated_bytes())

    monkeypatch.setattr(corpus_merge.Merger, "add_part", add_part)
    m = prepare_corpus(sorted(tmp_path.glob("in*.txt")), tmp_path / "out", cfg(holdout=0.5, min_chars=0))
    assert len(m.shards) == 2 and len(held) == 8  # one shard per split: --shard-size is far above the text
    assert max(held) < m.totals["text_bytes"] / 8, (held, m.totals["text_bytes"])
    order = {str(d): i for i, d in enumerate(docs)}
    for split in ("train", "holdout"):  # every document, each split in input order
        at = [order[str(r["sentences"])] for r in rows(tmp_path / "out", split)]
        assert at == sorted(at) and len(at) > 600


def test_holdout_is_a_stable_hash_split(tmp_path):
    docs = synthetic_docs(2000)
    write(tmp_path / "all.txt", as_paragraphs(docs))
    write(tmp_path / "half.txt", as_paragraphs(docs[::2]))
    m = prepare_corpus([tmp_path / "all.txt"], tmp_path / "o1", cfg(holdout=0.1, min_chars=0))
    held = {tuple(d["sentences"]) for d in rows(tmp_path / "o1", "holdout")}
    train = {tuple(d["sentences"]) for d in rows(tmp_path / "o1", "train")}
    assert not held & train and len(held) + len(train) == 2000
    # binomial(2000, 0.1): mean 200, sd 13.4; 5 sd either side
    assert 133 < len(held) < 267 and m.totals["holdout_documents"] == len(held)
    # a document's split depends only on its text: another run on other inputs puts it on the same side
    prepare_corpus([tmp_path / "half.txt"], tmp_path / "o2", cfg(holdout=0.1, min_chars=0))
    held2 = {tuple(d["sentences"]) for d in rows(tmp_path / "o2", "holdout")}
    assert held2 == {tuple(d) for d in docs[::2]} & held


# ------------------------------------------------------------------------------------------ workers and resume

def _mixed_inputs(tmp_path):
    docs = synthetic_docs(240)
    for i in range(6):
        write(tmp_path / "in" / f"f{i}.txt", as_paragraphs(docs[i * 40:(i + 1) * 40] + docs[:3]))  # + duplicates
    write(tmp_path / "in" / "w.gz", WIKI, gzip.open)
    return [tmp_path / "in"]


@pytest.mark.parametrize("real", [False, True], ids=["fixture", "fixture+ko-wiki"])
def test_one_and_two_workers_write_identical_bytes(tmp_path, request, real):
    inputs = _mixed_inputs(tmp_path)
    if real:  # skips (with the fixture's reason) when ../shared/data is absent; the fixture case always runs
        inputs.append(request.getfixturevalue("shared_data") / "wikipedia_ko_wikiextractor/text/AA/wiki_00")
    options = dict(holdout=0.05, shard_size=parse_size("16KB"))
    m1 = prepare_corpus(inputs, tmp_path / "w1", cfg(workers=1, **options))
    m2 = prepare_corpus(inputs, tmp_path / "w2", cfg(workers=2, **options))
    assert len(m1.shards) > 2 and m1.dropped["duplicate"] == 6 * 3 + 1
    assert shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2")
    assert m1.shards == m2.shards


def test_a_stage_folder_is_compared_and_its_text_counted_as_the_benchmarks_do(tmp_path):
    """bertkit.testing's stage_outputs (what test_ray and benchmarks/studies/scale.py compare) and text_bytes (the
    per-GB denominator of scale.py and tokenizer_sample.py), against the rows read back and encoded here."""
    from bertkit.testing import stage_outputs, text_bytes

    docs = synthetic_docs(60) + [["한국어 문장은 글자마다 세 바이트입니다.", "둘째 문장도 그렇습니다."]]
    source = write(tmp_path / "in.txt", as_paragraphs(docs))
    options = dict(holdout=0.1, shard_size=parse_size("2KB"))
    prepare_corpus([source], tmp_path / "a", cfg(workers=1, **options))
    prepare_corpus([source], tmp_path / "b", cfg(workers=2, **options))
    a = stage_outputs(tmp_path / "a")
    assert a == stage_outputs(tmp_path / "b") and "manifest.json" not in a
    assert set(a) == {p.name for p in (tmp_path / "a").glob("*.arrow")} and len(a) > 2
    shard = next((tmp_path / "b").glob("*.arrow"))
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
    assert stage_outputs(tmp_path / "b") != a
    for split in ("train", "holdout"):
        encoded = sum(len(s.encode("utf-8")) for r in rows(tmp_path / "a", split) for s in r["sentences"])
        assert text_bytes(tmp_path / "a", split) == encoded > 0
    first = corpus_shards(tmp_path / "a", "train")[0]
    assert text_bytes(tmp_path / "a", shards=1) == sum(len(s.encode("utf-8")) for r in read_arrow(first).to_pylist()
                                                        for s in r["sentences"])


def test_resume_after_interrupt_in_merge_and_in_worker(tmp_path, monkeypatch):
    import bertkit.pipelines.prepare_corpus as pc
    from bertkit.pipelines import corpus_merge

    inputs = _mixed_inputs(tmp_path)
    options = dict(holdout=0.05, shard_size=parse_size("8KB"))
    clean = prepare_corpus(inputs, tmp_path / "clean", cfg(**options))

    # 1) killed inside a worker, half-way through a file (its part stays unfinished)
    real_process, seen = pc.process_file, []

    def die_in_third_file(index, *a):
        seen.append(index)
        if len(seen) == 3:
            Path(a[-1]).with_name(Path(a[-1]).name + ".12345.tmp").write_bytes(b"half a part")
            raise KeyboardInterrupt
        return real_process(index, *a)

    monkeypatch.setattr(pc, "process_file", die_in_third_file)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(inputs, tmp_path / "out", cfg(**options))
    monkeypatch.setattr(pc, "process_file", real_process)

    assert len(list((tmp_path / "out" / ".work").glob("part-*.json"))) == 2

    # 2) then killed while merging the resumed run, after some shards were written
    real_flush, calls = corpus_merge.ShardWriter.flush, []

    def flush_then_die(self):
        real_flush(self)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(corpus_merge.ShardWriter, "flush", flush_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(inputs, tmp_path / "out", cfg(**options))
    monkeypatch.setattr(corpus_merge.ShardWriter, "flush", real_flush)
    with pytest.raises(CorpusError, match="did not finish"):
        corpus_shards(tmp_path / "out")

    resumed = prepare_corpus(inputs, tmp_path / "out", cfg(**options))
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "clean")
    assert resumed.totals == clean.totals and resumed.dropped == clean.dropped
    ids = [d["id"] for d in rows(tmp_path / "out")]
    assert len(ids) == len(set(ids)) == clean.totals["documents"]


def test_resume_after_sigkill(tmp_path):
    docs = synthetic_docs(400)
    for i in range(8):
        write(tmp_path / "in" / f"f{i}.txt", as_paragraphs(docs[i * 50:(i + 1) * 50] + docs[:2]))
    out = tmp_path / "out"
    # a real process, slowed down per file so the kill lands mid-run, then SIGKILLed: no cleanup code runs
    script = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); import bertkit.pipelines.prepare_corpus as pc\n"
              "real = pc.process_file\n"
              "def slow(*a):\n    s = real(*a); time.sleep(0.3); return s\n"
              "pc.process_file = slow\n"
              f"pc.prepare_corpus([{str(tmp_path / 'in')!r}], {str(out)!r}, "
              "pc.CorpusConfig(progress=False, holdout=0.1, shard_size=2048, workers=2))\n")
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while len(list((out / ".work").glob("part-*.json"))) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    children_file = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    workers = [int(p) for p in children_file.read_text().split()] if children_file.exists() else []
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the workers die with the main process (no straggler keeps writing parts while the resumed run works)
    alive = set(workers)
    for _ in range(100):
        for pid in list(alive):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                alive.discard(pid)
        if not alive:
            break
        time.sleep(0.05)
    for pid in alive:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert not alive, "worker processes outlived the killed run"
    assert not (out / "manifest.json").exists() or not json.loads((out / "manifest.json").read_text())["complete"]
    done_before = len(list((out / ".work").glob("part-*.json")))
    assert 3 <= done_before < 8
    m = prepare_corpus([tmp_path / "in"], out, cfg(holdout=0.1, shard_size=2048))
    prepare_corpus([tmp_path / "in"], tmp_path / "clean", cfg(holdout=0.1, shard_size=2048))
    assert shard_bytes(out) == shard_bytes(tmp_path / "clean")
    got = sorted(tuple(d["sentences"]) for d in rows(out))
    assert got == sorted(tuple(d) for d in docs) and m.dropped["duplicate"] == 8 * 2


def test_rerun_is_a_no_op_and_other_options_need_overwrite(tmp_path):
    write(tmp_path / "a.txt", as_paragraphs(synthetic_docs(20)))
    first = prepare_corpus([tmp_path / "a.txt"], tmp_path / "out", cfg())
    assert prepare_corpus([tmp_path / "a.txt"], tmp_path / "out", cfg()) == first
    with pytest.raises(CorpusError, match="--overwrite"):
        prepare_corpus([tmp_path / "a.txt"], tmp_path / "out", cfg(min_chars=10))
    m = prepare_corpus([tmp_path / "a.txt"], tmp_path / "out", cfg(min_chars=10, overwrite=True))
    assert m.options["min_chars"] == 10
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "manifest.json").write_text(json.dumps({"stage": "train-tokenizer"}))
    with pytest.raises(FolderNotOwnedError, match="holds a tokenizer folder"):  # not even with --overwrite
        prepare_corpus([tmp_path / "a.txt"], tmp_path / "tok", cfg(overwrite=True))
    assert json.loads((tmp_path / "tok" / "manifest.json").read_text()) == {"stage": "train-tokenizer"}


# ------------------------------------------------------------------------------------------ bad input

def test_bad_inputs_are_reported_and_never_cost_other_files(tmp_path):
    good = synthetic_docs(5)
    write(tmp_path / "in" / "good.txt", as_paragraphs(good))
    (tmp_path / "in" / "binary.bin").write_bytes(bytes(range(256)) * 40)
    bad_utf8 = as_paragraphs(synthetic_docs(1, seed=1)).encode().replace(b"river", b"riv\xff\xfer")
    bad_utf8 = bad_utf8 if b"\xff" in bad_utf8 else bad_utf8.replace(b"Document", b"Docu\xffment")
    (tmp_path / "in" / "latin.txt").write_bytes(bad_utf8)
    payload = gzip.compress((as_paragraphs(synthetic_docs(300, seed=2))).encode())
    (tmp_path / "in" / "cut.txt.gz").write_bytes(payload[: len(payload) // 2])
    # zstd emits whole blocks (128 KB) only: half of a 400 KB stream still holds complete documents
    zst = zstandard.ZstdCompressor().compress(as_paragraphs(synthetic_docs(3000, seed=3)).encode())
    (tmp_path / "in" / "cut.txt.zst").write_bytes(zst[: len(zst) // 2])
    xz = lzma.compress(as_paragraphs(synthetic_docs(3000, seed=4)).encode())
    (tmp_path / "in" / "cut.txt.xz").write_bytes(xz[: len(xz) // 2])
    write(tmp_path / "in" / "plain.txt.gz", as_paragraphs(synthetic_docs(2, seed=5)))  # named .gz, but plain text
    write(tmp_path / "in" / "broken.wiki",
          '<doc id="1" title="A">\nA\n\nFirst document text is long enough to keep here.\n'
          '<doc id="2" title="B">\nB\n\nSecond document text is long enough to keep too.\n</doc>\n'
          'stray text outside of any block\n</doc>\n')
    write(tmp_path / "in" / "docs.jsonl", json.dumps({"text": " ".join(good[0]) + " Extra."}) + "\n"
          + json.dumps({"body": "no text field"}) + "\n{not json\n")
    write(tmp_path / "in" / "array.json", json.dumps([{"text": "A JSON array is not JSON Lines at all."}]))
    (tmp_path / "empty").mkdir()
    runner = CliRunner()
    result = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "in"), str(tmp_path / "missing.txt"),
                                 str(tmp_path / "empty"), "--out", str(tmp_path / "out"), "--no-progress",
                                 "--holdout", "0", "--min-chars", "20", "-j", "1"])
    assert result.exit_code == 0, result.output
    log = result.output
    assert "missing.txt: no such file or folder" in log
    assert "empty: folder holds no (non-hidden, non-documentation) files" in log
    assert "binary.bin: looks binary" in log and "array.json: is a JSON array" in log
    assert "cut.txt.gz: reading stopped at line" in log and "truncated" in log
    assert "cut.txt.zst: reading stopped at line" in log and "cut.txt.xz: reading stopped at line" in log
    assert "broken.wiki:1: <doc> opened at line 1 has no </doc>" in log
    assert "broken.wiki:10: text outside any <doc>" in log
    assert "broken.wiki:11: </doc> without an opening" in log
    assert "docs.jsonl:2: has no 'text' field" in log and "--text-field" in log
    assert "docs.jsonl:3: not valid JSON" in log
    assert "latin.txt:1: " in log and "undecodable byte(s) replaced" in log
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    by_source = {i["source"]: i for i in m["inputs"]}
    assert by_source["in/good.txt"]["documents"] == 5 and by_source["in/binary.bin"]["documents"] == 0
    assert by_source["in/latin.txt"]["documents"] == 1 and by_source["in/latin.txt"]["replaced_bytes"] >= 1
    assert 0 < by_source["in/cut.txt.gz"]["documents"] < 300 and by_source["in/cut.txt.gz"]["error"]
    assert 0 < by_source["in/cut.txt.zst"]["documents"] < 3000 and 0 < by_source["in/cut.txt.xz"]["documents"] < 3000
    assert by_source["in/plain.txt.gz"]["documents"] == 2 and by_source["in/plain.txt.gz"]["compression"] is None
    assert by_source["in/broken.wiki"]["documents"] == 2 and by_source["in/docs.jsonl"]["documents"] == 1
    assert m["dropped"]["missing_field"] == 1 and m["dropped"]["bad_json"] == 1
    assert m["totals"]["files_with_errors"] == 5 and len(m["errors"]) == 7  # 5 files + missing path + empty folder
    kept = [d["sentences"] for d in rows(tmp_path / "out")]
    assert all(d in kept for d in good[1:])
    # the same inputs with --strict: output written, but the run reports failure
    strict = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "in"), "--out", str(tmp_path / "out2"),
                                 "--no-progress", "--strict", "-j", "1"])
    assert strict.exit_code != 0 and "--strict" in strict.output
    assert read_corpus_manifest(tmp_path / "out2").complete


def test_run_fails_only_when_nothing_usable(tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code != 0 and "no such file or folder" in r.output
    (tmp_path / "empty").mkdir()
    r = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code != 0 and "folder holds no" in r.output
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\x02" * 1000)
    r = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "bin.dat"), "--out", str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code != 0 and "no documents were kept" in r.output and "looks binary" in r.output
    write(tmp_path / "x.jsonl", json.dumps({"content": "Some text that is surely long enough to be kept here."}) + "\n")
    r = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o2"),
                            "--no-progress"])
    assert r.exit_code != 0 and "x.jsonl:1: has no 'text' field (keys: content)" in r.output
    r = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o2"),
                            "--no-progress", "--text-field", "content", "--shard-size", "lots"])
    assert r.exit_code != 0 and "not a size" in r.output
    r = runner.invoke(cli, ["prepare-corpus", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o2"),
                            "--no-progress", "--text-field", "content", "--holdout", "0"])
    assert r.exit_code == 0, r.output
    assert rows(tmp_path / "o2")[0]["sentences"] == ["Some text that is surely long enough to be kept here."]


# ------------------------------------------------------------------------------------------ real data

def test_english_wikipedia_sample(tmp_path, shared_data):
    src = shared_data / "wikipedia_en_wikiextractor" / "text" / "AA" / "wiki_00"
    m = prepare_corpus([src], tmp_path / "out", cfg(holdout=0.05))
    n_docs = src.read_text(encoding="utf-8").count("<doc ")
    assert m.totals["documents_read"] == n_docs
    assert m.totals["documents"] + sum(m.dropped.values()) == n_docs
    assert m.removed_lines["repeated_title"] == n_docs and not m.errors
    docs = rows(tmp_path / "out")
    titles = [d["title"] for d in docs]
    assert "Anarchism" in titles and len(set(d["id"] for d in docs)) == len(docs)
    anarchism = docs[titles.index("Anarchism")]["sentences"]
    assert anarchism[0].startswith("Anarchism is a political philosophy") and anarchism[0].endswith("associations.")
    assert anarchism[1] == "Anarchism holds the state to be undesirable, unnecessary, or harmful."
    sentences = [s for d in docs for s in d["sentences"]]
    assert all(s == " ".join(s.split()) and s for s in sentences)
    assert "Anarchism" not in sentences  # the repeated title line is not a sentence


def test_korean_wikipedia_sample_keeps_syllables(tmp_path, shared_data):
    src = shared_data / "wikipedia_ko_wikiextractor" / "text" / "AA" / "wiki_02"
    text = src.read_text(encoding="utf-8")
    assert not any(ord(c) in JAMO for c in text)
    m = prepare_corpus([src], tmp_path / "out", cfg())
    docs = rows(tmp_path / "out")
    assert m.totals["documents_read"] == text.count("<doc ") and len(docs) > 50
    joined = "".join(s for d in docs for s in d["sentences"])
    assert not any(ord(c) in JAMO for c in joined)
    hangul = sum("\uac00" <= c <= "\ud7a3" for c in joined)
    assert hangul > 0.5 * sum("\uac00" <= c <= "\ud7a3" for c in text)
    # Korean declarative endings close sentences: few sentences keep '다. ' inside them (quotes aside)
    inner = sum(s.count("다. ") for d in docs for s in d["sentences"])
    assert inner < 0.02 * sum(len(d["sentences"]) for d in docs)


def test_inputs_expand_in_a_stable_order_with_distinct_sources(tmp_path):
    docs = synthetic_docs(6)
    for sub, i in (("b", 0), ("a/z", 1), ("a", 2), ("c", 3)):
        write(tmp_path / "data" / sub / "x.txt", as_paragraphs(docs[i:i + 1]))
    write(tmp_path / "data" / ".hidden" / "x.txt", as_paragraphs(docs[4:5]))
    out = tmp_path / "data" / "corpus"  # the output inside an input folder is never read back
    prepare_corpus([tmp_path / "data" / "b", tmp_path / "data"], out, cfg(min_chars=0))
    prepare_corpus([tmp_path / "data"], out, cfg(min_chars=0, overwrite=True))  # its own shards are not inputs
    got = rows(out)
    assert [d["source"] for d in got] == ["data/a/x.txt", "data/a/z/x.txt", "data/b/x.txt", "data/c/x.txt"]
    assert [d["sentences"] for d in got] == [docs[2], docs[1], docs[0], docs[3]]
    m = prepare_corpus([str(tmp_path / "data" / "*" / "x.txt"), tmp_path / "data" / "c" / "x.txt"],
                       tmp_path / "o2", cfg(min_chars=0))
    assert [i["source"] for i in m.inputs] == ["data/a/x.txt", "data/b/x.txt", "data/c/x.txt"]
    assert any("given more than once" in e for e in m.errors)


def test_folder_walk_skips_documentation_files(tmp_path, capsys):
    """A dataset folder's README.md / SOURCE.md / LICENSE are not corpus text; named explicitly they are read."""
    docs = synthetic_docs(3)
    write(tmp_path / "data" / "wiki_00", as_paragraphs(docs[:1]))
    write(tmp_path / "data" / "part" / "b.txt", as_paragraphs(docs[1:2]))
    for name in ("SOURCE.md", "README", "part/LICENSE.txt"):
        write(tmp_path / "data" / name, as_paragraphs(docs[2:3]))
    m = prepare_corpus([tmp_path / "data"], tmp_path / "out", cfg(min_chars=0))
    assert [d["source"] for d in rows(tmp_path / "out")] == ["data/part/b.txt", "data/wiki_00"]
    assert sorted(Path(p).name for p in m.skipped_files) == ["LICENSE.txt", "README", "SOURCE.md"]
    assert not m.errors
    assert "SOURCE.md: a documentation file" in capsys.readouterr().err
    m = prepare_corpus([tmp_path / "data" / "SOURCE.md"], tmp_path / "out2", cfg(min_chars=0))
    assert m.totals["documents"] == 1 and not m.skipped_files


def test_huge_lines_and_blocks_are_cut_so_memory_stays_bounded(tmp_path, monkeypatch):
    from bertkit.pipelines import corpus_readers

    monkeypatch.setattr(corpus_readers, "MAX_LINE_BYTES", 64)
    monkeypatch.setattr(corpus_readers, "MAX_DOC_CHARS", 400)
    long_text = "".join(f"Hangul 한글 number {i} stays whole. " for i in range(40))  # multi-byte chars straddle cuts
    write(tmp_path / "long.txt", long_text + "\n")
    write(tmp_path / "block.txt", "".join(f"Line number {i} of a file without blank lines.\n" for i in range(60)))
    m = prepare_corpus([tmp_path / "long.txt", tmp_path / "block.txt"], tmp_path / "out", cfg(min_chars=0))
    docs = rows(tmp_path / "out")
    text = "".join(s for d in docs if d["source"] == "long.txt" for s in d["sentences"])
    assert text.replace(" ", "") == long_text.replace(" ", "") and m.totals["replaced_bytes"] == 0
    blocks = [d["sentences"] for d in docs if d["source"] == "block.txt"]
    assert len(blocks) > 5 and sum(len(b) for b in blocks) == 60  # cut into several documents, nothing lost
    assert "long.txt:1: line longer than 64 bytes" in " ".join(m.inputs[0]["messages"])
    assert m.inputs[1]["problems"]["long_document"] == len(blocks) - 1


def test_strict_fails_on_skipped_rows_and_a_symlink_loop_is_a_message(tmp_path):
    """--strict fails on any input problem, a bad JSON Lines row included (the output is still written); two
    symbolic links pointing at each other are an input problem, not a crash."""
    (tmp_path / "in").mkdir()
    good = json.dumps({"text": "A sentence that is long enough to be kept as a document of its own here."})
    (tmp_path / "in" / "rows.jsonl").write_text(good + "\n{not json\n" + good.replace("A sentence", "Another") + "\n")
    (tmp_path / "in" / "a").symlink_to(tmp_path / "in" / "b")
    (tmp_path / "in" / "b").symlink_to(tmp_path / "in" / "a")
    m = prepare_corpus([tmp_path / "in"], tmp_path / "out", cfg(min_chars=10))
    assert m.totals["documents"] == 2 and any("symbolic link loop" in e for e in m.errors)
    with pytest.raises(CorpusError, match="problem line"):
        prepare_corpus([tmp_path / "in" / "rows.jsonl"], tmp_path / "strict", cfg(min_chars=10, strict=True))
    assert read_corpus_manifest(tmp_path / "strict").totals["documents"] == 2


def test_odd_files_in_an_input_folder_are_skipped_by_name(tmp_path):
    """Issue 36, part 5: a FIFO (opening it would wait for ever) and a file whose name is not UTF-8 are each that
    file's problem, named, and the other files are read; an --out that is a dangling link or sits under a regular
    file is one line."""
    inp = tmp_path / "in"
    inp.mkdir()
    write(inp / "good.txt", "A sentence that is long enough to be kept as a document of its own here.\n")
    os.mkfifo(inp / "pipe.txt")
    with open(os.fsencode(inp) + b"/\xff\xfe.txt", "wb") as f:
        f.write(b"Some other text that is long enough to be a document of its own here.\n")
    m = prepare_corpus([inp], tmp_path / "out", cfg(min_chars=10))
    assert m.totals["documents"] == 1
    assert any("pipe.txt: not a regular file (a FIFO, socket or device); skipped" in e for e in m.errors)
    assert any("\\xff\\xfe.txt: the file name is not UTF-8" in e for e in m.errors)
    r = CliRunner().invoke(cli, ["prepare-corpus", str(inp / "pipe.txt"), "--out", str(tmp_path / "o2")])
    assert r.exit_code == 1 and "not a regular file" in r.output

    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "plain").write_text("x")
    for out, says in ((tmp_path / "dangling", f"a link to {tmp_path / 'nowhere'}, which does not exist"),
                      (tmp_path / "plain" / "sub", f"cannot be made, as {tmp_path / 'plain'} is a file")):
        r = CliRunner().invoke(cli, ["prepare-corpus", str(inp / "good.txt"), "--out", str(out)])
        assert r.exit_code == 1 and says in r.output and "Traceback" not in r.output, r.output
