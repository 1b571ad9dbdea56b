"""`bertkit check-gpu` without a GPU: it says so and exits 0; under the Triton interpreter on small shapes the whole
check runs (correctness, timing, verdict, JSON) and a wrong kernel is caught."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main

BIN = Path(sys.executable).parent


def interpreter_env():
    return dict(os.environ, TRITON_INTERPRET="1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the real check applies")
def test_without_cuda_says_so_and_exits_0(tmp_path):
    r = CliRunner().invoke(main, ["check-gpu", "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert "no CUDA GPU here" in r.output and "--kernels torch" in r.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["cuda"] is False and report["kernels"] == "torch"


def test_the_cases_cover_every_shipped_configuration():
    from bertkit.check_gpu import _attention_configs
    from bertkit.kernels.attention import DKDV_CONFIGS, DQ_CONFIGS, FWD_CONFIGS

    for head_dim, dim in ((64, 64), (32, 64), (128, 128)):
        runs = _attention_configs(head_dim, every=True)
        for name, shipped in (("fwd", FWD_CONFIGS), ("dkdv", DKDV_CONFIGS), ("dq", DQ_CONFIGS)):
            assert {r[name] for r in runs} == set(shipped[dim])
        assert _attention_configs(head_dim, every=False) == [{n: c[dim][0] for n, c in
                                                             (("fwd", FWD_CONFIGS), ("dkdv", DKDV_CONFIGS),
                                                              ("dq", DQ_CONFIGS))}]


@pytest.mark.slow
def test_under_the_interpreter_the_whole_check_runs(tmp_path):
    out = tmp_path / "check.json"
    r = subprocess.run([str(BIN / "bertkit"), "check-gpu", "--device", "cpu", "--small", "--quick", "--dtype", "fp32",
                        "--dtype", "fp16", "--out", str(out)], env=interpreter_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    # 2 dtypes x 2 dropout rates x ((padded + varlen) x 3 attentions (BERT's, ModernBERT's global and local) +
    # 2 LayerNorm hidden sizes x post/pre-LN)
    assert report["passed"] == 40 and report["failed"] == 0
    kinds = {(c["config"]["window"], c["config"]["rope_theta"]) for c in report["cases"] if c["kernel"] == "attention"}
    assert kinds == {(None, None), (None, 160_000.0), (16, 10_000.0)}
    assert {c["config"].get("prenorm") for c in report["cases"] if c["kernel"] == "layer_norm"} == {False, True}
    for case in report["cases"]:
        assert case["errors"] and all(ours <= 2 * torch_err + 1e-5 for ours, torch_err in case["errors"].values())
    impls = {(row["kernel"], row["impl"]) for row in report["timing"] if "error" not in row}
    assert {("attention", "triton"), ("layer_norm", "triton"), ("layer_norm", "torch")} <= impls
    assert report["peaks"]["copy_gb_s"] > 0 and report["kernels"] in ("auto", "torch")
    assert "use: --kernels" in r.stdout


@pytest.mark.slow
def test_a_wrong_kernel_fails_the_check(tmp_path):
    """Perturb the attention forward by 1%: the check must fail it and advise --kernels torch."""
    script = f"""
import importlib
from bertkit.check_gpu import CheckConfig, check_gpu
attn = importlib.import_module("bertkit.kernels.attention")  # the package's `attention` is the function
real = attn.flash_attn_forward
def wrong(*args, **kwargs):
    out, lse = real(*args, **kwargs)
    return out * 1.01, lse
attn.flash_attn_forward = wrong
r = check_gpu(CheckConfig(device="cpu", small=True, every_config=False, timing=False, dtypes=("fp32",),
                          hiddens=(128,), out={str(tmp_path / "bad.json")!r}), progress=lambda line: None)
print(r["failed"], r["passed"], r["kernels"])
"""
    r = subprocess.run([sys.executable, "-c", script], env=interpreter_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    failed, passed, backend = r.stdout.split()[-3:]
    # the attention cases (padded, varlen; with and without dropout; BERT's and ModernBERT's two) fail, the
    # LayerNorm ones (post, pre) pass
    assert (int(failed), int(passed), backend) == (12, 4, "torch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the real check applies")
def test_json_on_stdout_is_the_report_to_attach(tmp_path):
    r = subprocess.run([str(BIN / "bertkit"), "check-gpu", "--json", "--out", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)  # stdout holds the JSON alone; the progress lines went to stderr
    assert report == json.loads((tmp_path / "r.json").read_text())
    assert {"bertkit", "torch", "triton", "python", "platform", "device", "verdict"} <= set(report)
    assert "verdict:" in r.stderr
