"""finetune --precision: bf16 autocast over fp32 weights tracks fp32 (on a GPU where there is one: this file needs
no DeepSpeed, so benchmarks/gpu_session.sh runs it there), auto picks bf16 only where the device has bf16 units, and a
CPU without them says bf16 will be slower."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers import tiny_model_folder


def finetune_tiny(tmp_path, precision: str, device: str = "auto") -> dict:
    """`finetune classify` of a tiny model for one epoch at this --precision (on a GPU where there is one); its
    metrics.json."""
    from bertkit.cli import main as cli

    if not (tmp_path / "train.tsv").is_file():
        tiny_model_folder(tmp_path)
        rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27} w{(i * 3) % 27}\t{i % 2}" for i in range(32)]
        (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    out = tmp_path / precision
    result = CliRunner().invoke(cli, ["finetune", "classify", "--out", str(out), "--model", str(tmp_path / "tiny"),
                                      "--epochs", "1", "--batch-size", "8", "--max-seq-length", "16", "--lr", "1e-3",
                                      "--report-to", "none", "--no-save-model", "--train-file",
                                      str(tmp_path / "train.tsv"), "--dev-file", str(tmp_path / "train.tsv"),
                                      "--text-a", "text", "--precision", precision, "--device", device])
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def test_finetuning_in_bf16_tracks_fp32_and_is_recorded(tmp_path):
    """`finetune --precision bf16`: the first epoch's loss is fp32's to within bf16's rounding but not equal (the
    autocast ran in training), and the setting is in metrics.json."""
    fp32, bf16 = finetune_tiny(tmp_path, "fp32"), finetune_tiny(tmp_path, "bf16")
    assert bf16["settings"]["precision"] == "bf16"
    fp32_loss, bf16_loss = fp32["epochs"][0]["train_loss"], bf16["epochs"][0]["train_loss"]
    assert bf16_loss == pytest.approx(fp32_loss, rel=1e-2) and bf16_loss != fp32_loss


def test_a_bf16_fine_tuning_evaluates_in_fp32(tmp_path, monkeypatch):
    """bf16 trains; predictions are made in fp32 (bf16 logits reorder close answers: on SQuAD they cost 0.6 F1):
    no evaluation of a bf16 run runs under autocast."""
    import torch

    import bertkit.finetune.train as T

    seen, predict = [], T.predict

    def watched(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return predict(*args, **kwargs)

    monkeypatch.setattr(T, "predict", watched)
    finetune_tiny(tmp_path, "bf16", "cpu")
    assert seen and not any(seen)


@pytest.mark.parametrize("units", [True, False])
def test_finetuning_precision_auto_is_bf16_where_the_cpu_has_bf16_units(tmp_path, monkeypatch, units):
    """`--precision auto` runs (and records) bf16 on a CPU with bf16 units, fp32 on one without: its loss is the
    chosen precision's exactly."""
    import bertkit.precision

    chosen = finetune_tiny(tmp_path, "bf16" if units else "fp32", "cpu")
    monkeypatch.setattr(bertkit.precision, "cpu_bf16_units", lambda: units)
    auto = finetune_tiny(tmp_path, "auto", "cpu")
    assert auto["settings"]["precision"] == ("bf16" if units else "fp32")
    assert auto["epochs"][0]["train_loss"] == chosen["epochs"][0]["train_loss"]


def test_bf16_on_a_cpu_without_bf16_units_says_so(tmp_path, monkeypatch):
    """Where the CPU has no bf16 matrix units a bf16 run is slower than fp32: the run says so (and still runs)."""
    from bertkit import precision
    from bertkit.cli import main as cli

    tiny_model_folder(tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27}\t{i % 2}" for i in range(16)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    args = ["finetune", "classify", "--model", str(tmp_path / "tiny"), "--epochs", "1", "--batch-size", "8",
            "--max-seq-length", "16", "--report-to", "none", "--no-save-model", "--train-file",
            str(tmp_path / "train.tsv"), "--dev-file", str(tmp_path / "train.tsv"), "--text-a", "text",
            "--precision", "bf16"]
    here = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "here")])
    assert here.exit_code == 0, here.output
    assert ("no bf16 matrix units" in here.output) == (not precision.cpu_bf16_units())
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: False)
    older = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "older")])
    assert older.exit_code == 0 and "no bf16 matrix units" in older.output, older.output


def test_cpu_bf16_units_reads_the_same_answer_torch_probes_give():
    """The CPU's bf16 units are read from /proc/cpuinfo's flags (public, stable); torch's own (private) probes of
    the same instructions are the independent reference where they exist."""
    import torch

    from bertkit.precision import probe_cpu_bf16_units as cpu_bf16_units  # the probe: conftest pins the answer

    probes = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    if not Path("/proc/cpuinfo").is_file() or None in probes:
        pytest.skip("needs Linux's /proc/cpuinfo and torch's CPU probes to compare")
    assert cpu_bf16_units() == any(probe() for probe in probes)
