"""prepare-corpus --languages: documents identified offline (py3langid's model, in its wheel), kept by language and
probability, the language recorded in a column and counted."""
import json

import pyarrow as pa
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.formats import corpus_shards, read_corpus_manifest
from bertkit.pipelines.language import identify

DOCS = {"ko": "대한민국의 수도는 서울이다. 서울은 한강을 끼고 있으며 많은 사람이 산다. 역사가 오래된 도시이다.",
        "en": "The river rises in the northern hills. It flows south through three towns before reaching the sea.",
        "de": "Der Fluss entspringt in den nördlichen Hügeln. Er fließt durch drei Städte bis zum Meer hinunter.",
        "laughter": "ㅋㅋㅋㅋ ㅋㅋㅋ ㅋㅋㅋㅋㅋ ㅋㅋ ㅋㅋㅋㅋ ㅋㅋㅋ ㅋㅋㅋㅋㅋ ㅋㅋㅋ ㅋㅋㅋㅋ ㅋㅋ ㅋㅋㅋ ㅋㅋㅋㅋ"}


def test_identify_offline():
    assert identify(DOCS["ko"])[0] == "ko" and identify(DOCS["en"])[0] == "en" and identify(DOCS["de"])[0] == "de"
    assert identify(DOCS["ko"])[1] > 0.9


def test_prepare_corpus_keeps_the_languages_asked_for(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"title": k, "text": v}, ensure_ascii=False) + "\n"
                                               for k, v in DOCS.items()))
    r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out"),
                                  "--languages", "ko,en", "--language-score", "0.5", "--holdout", "0",
                                  "--min-chars", "10", "--no-progress"])
    assert r.exit_code == 0, r.output
    table = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in corpus_shards(tmp_path / "out")])
    assert dict(zip(table.column("title").to_pylist(), table.column("language").to_pylist())) == {"ko": "ko",
                                                                                                   "en": "en"}
    manifest = read_corpus_manifest(tmp_path / "out")
    assert manifest.dropped["language"] == 2 and manifest.totals["languages_identified"]["de"] == 1
    assert manifest.options["languages"] == ["ko", "en"] and manifest.schema["language"] == "string"


def test_an_unsure_guess_is_dropped_by_its_score(tmp_path):
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    assert identify(DOCS["laughter"])[1] < 0.5   # ㅋㅋ alone: a weak guess whatever the language
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": v}, ensure_ascii=False) + "\n"
                                               for v in DOCS.values()))
    languages = sorted({identify(v)[0] for v in DOCS.values()})   # every language guessed is asked for
    manifest = prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "out", CorpusConfig(
        languages=languages, language_score=0.5, holdout=0, min_chars=10, progress=False))
    assert manifest.dropped["language"] == 1 and manifest.totals["documents"] == 3
