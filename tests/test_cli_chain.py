"""The card's usage, literally: each stage's default output is where the next stage looks.

    bertkit prepare-corpus wiki/ ; bertkit train-tokenizer ; bertkit make-instances --dupe 10 ; bertkit pretrain
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ENGLISH = [
    "The river rises in the northern hills. It flows south through three towns before reaching the sea.",
    "Farmers along its banks grow wheat and barley. In spring the water often floods the lower fields.",
    "A stone bridge was built in the twelfth century. It still carries traffic across the narrowest point.",
    "The town library holds old maps of the valley. Visitors can read them in a quiet room upstairs.",
]
KOREAN = [
    "강은 북쪽 언덕에서 시작된다. 남쪽으로 흘러 세 마을을 지나 바다에 이른다.",
    "강가의 농부들은 밀과 보리를 기른다. 봄에는 물이 낮은 들판을 자주 덮는다.",
]


def write_wiki_tree(root: Path) -> None:
    docs = ENGLISH + KOREAN
    for f in range(2):
        lines = []
        for i, text in enumerate(docs):
            doc_id = f * 100 + i
            title = f"Article {doc_id}"
            body = " ".join([text] * 3)  # a few sentences each, long enough to pass --min-chars
            lines += [f'<doc id="{doc_id}" url="https://example.org/?curid={doc_id}" title="{title}">', title, "",
                      body.replace(". ", f". (v{f}) "), "</doc>"]
        path = root / "text" / "AA" / f"wiki_{f:02d}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def bertkit(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "bertkit.cli", *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"bertkit {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_stages_chain_through_default_folders(tmp_path):
    write_wiki_tree(tmp_path / "wiki")
    # an evaluation file whose sentence the corpus holds: cleaned out, and every score on it says so
    (tmp_path / "eval.tsv").write_text("text\tlabel\nIt flows south through three towns before reaching the sea\t1\n"
                                       "Farmers along its banks grow wheat\t0\n")
    bertkit("prepare-corpus", "wiki/", "--holdout", "0", "--decontaminate", "eval.tsv", cwd=tmp_path)
    corpus = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    assert corpus["complete"] and sum(s["rows"] for s in corpus["shards"]) == 12
    assert corpus["totals"]["decontamination"]["files"]["eval.tsv"]["documents"] == 2

    bertkit("train-tokenizer", "--vocab-size", "300", cwd=tmp_path)
    vocab = (tmp_path / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert "강" in vocab  # Hangul kept as syllables, not jamo

    bertkit("make-instances", "--dupe", "10", "--max-seq-length", "32", cwd=tmp_path)
    instances = json.loads((tmp_path / "instances" / "manifest.json").read_text())
    assert instances["complete"] and instances["dupe"] == 10
    assert instances["vocab_size"] == len([t for t in vocab if t])

    bertkit("pretrain", "--model", "tiny", "--max-steps", "2", "--micro-batch", "4", "--eval-every", "0",
            "--save-every", "2", "--no-progress", cwd=tmp_path)
    assert (tmp_path / "runs" / "pretrain" / "checkpoints" / "latest").is_file()

    bertkit("export", "runs/pretrain", "--out", "model", cwd=tmp_path)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["bertkit"]["decontaminated_against"] == \
        ["eval.tsv"]
    bertkit("finetune", "classify", "--model", "model", "--train-file", "eval.tsv", "--dev-file", "eval.tsv",
            "--text-a", "text", "--label", "label", "--epochs", "1", "--out", "ft", "--no-save-model", cwd=tmp_path)
    record = json.loads((tmp_path / "ft" / "metrics.json").read_text())["pretraining_corpus"]
    assert record == {"decontaminated_against": ["eval.tsv"], "scored_file": "eval.tsv",
                      "scored_file_decontaminated": True}


def readme_stage_block() -> list[str]:
    """The `bertkit ...` lines of the README's Stages block, comments cut, as a user copies them."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Stages", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.startswith("bertkit ")]


# what each line gets appended so that a test finishes in about a minute: a flag given twice, the last one wins
SMALLER = {"train-tokenizer": ["--vocab-size", "300"],
           "pretrain": ["--time-budget", "10s", "--micro-batch", "8", "--eval-every", "0", "--no-progress"],
           "finetune": ["--epochs", "1"]}


@pytest.mark.slow
def test_the_readme_stage_block_runs_as_written(tmp_path):
    """Every line of README.md's Stages block, in order, in an empty folder holding only wiki/ and glue/: a README
    edit that breaks the chain (a renamed flag, a default folder one stage no longer finds) fails here."""
    lines = readme_stage_block()
    assert [line.split()[1] for line in lines][:5] == ["prepare-corpus", "train-tokenizer", "make-instances",
                                                      "pretrain", "export"]
    write_wiki_tree(tmp_path / "wiki")
    sst2 = tmp_path / "glue" / "SST-2"
    sst2.mkdir(parents=True)
    rows = [f"{s} \t{i % 2}" for i, s in enumerate(ENGLISH * 4)]
    for split in ("train", "dev"):
        (sst2 / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    for line in lines:
        args = line.split()[1:]
        bertkit(*args, *SMALLER.get(args[0], []), cwd=tmp_path)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert 0 <= json.loads((tmp_path / "runs" / "sst2" / "metrics.json").read_text())["best"]["accuracy"] <= 1
