"""The README's first command: `make demo` runs examples/demo.sh, every stage on the embedded corpus. Nothing else
runs it, so a change that breaks a stage's flags or files would first be seen by a newcomer. Here with 20
pretraining steps a model (DEMO_STEPS) into a temporary folder (DEMO_OUT)."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import env_without_dist

pytestmark = pytest.mark.slow  # two DeepSpeed ranks, two pretrainings, a fine-tuning: minutes

REPO = Path(__file__).resolve().parents[1]


def test_the_demo_runs_every_stage_and_leaves_what_the_readme_says(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run(["bash", str(REPO / "examples" / "demo.sh")], capture_output=True, text=True, timeout=1800,
                       env=env_without_dist(DEMO_OUT=str(out), DEMO_STEPS="20", TQDM_DISABLE="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = r.stdout
    for stage in range(1, 9):
        assert f"\n== {stage}. " in said
    assert "transformers loads it: ModernBertForMaskedLM" in said
    # fill-mask's top-5 lists, each headed by its best guess and probability: two sentences for BERT, one for ModernBERT
    assert len(re.findall(r"^\s+1\. \S+\s+0\.\d{4}$", said, re.M)) == 3
    for model in ("model", "model-modernbert"):
        assert json.loads((out / model / "config.json").read_text())["vocab_size"] >= 3000  # the demo's vocabulary
    for report in ("run/report.html", "finetune/report.html"):
        assert (out / report).stat().st_size > 0
    fine_tuned = json.loads((out / "finetune" / "metrics.json").read_text())
    accuracy = [e["accuracy"] for e in fine_tuned["epochs"]]
    # the demo's 5 epochs, the last kept (--select last: nothing chosen on the dev file it reports)
    assert len(accuracy) == 5 and fine_tuned["best_epoch"] == 5 and fine_tuned["best"]["accuracy"] == accuracy[-1]
