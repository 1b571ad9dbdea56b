"""`--kernels auto` on a GPU checks the Triton kernels there before trusting them (bertkit/kernel_guard.py), tested
without a GPU: stand-in checks (a pass, a failed case, a compile error), the cache (a pass is remembered; a pass for
another Triton version is not), and the real checks under the Triton interpreter on the CPU, including a kernel made
to return a wrong gradient."""
import json
import os
import re
import subprocess
import sys

import pytest

from bertkit.check_gpu import CaseResult
from bertkit.kernel_guard import KernelUse, cache_dir, choose_backend, kernel_uses

USE = KernelUse(head_dim=64, hidden=128, dtype="bf16", varlen=False, dropout=0.1, prenorm=True)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(tmp_path / "cache"))


def case(passed, message=""):
    return CaseResult("layer_norm", "bf16", "rows", 0.1, {"hidden": 128}, {}, True, passed, message)


class Checks:
    """A stand-in for run_checks that counts its calls."""

    def __init__(self, result):
        self.result, self.calls = result, 0

    def __call__(self, use, device):
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_a_pass_is_cached_and_skipped_next_time():
    said, checks = [], Checks([case(True), case(True)])
    assert choose_backend("cpu", USE, said.append, checks) == "triton"
    assert checks.calls == 1 and said[0].startswith("checking the Triton kernels") and len(said) == 2
    assert "2 cases" in said[1] and str(cache_dir()) in said[1]
    said.clear()
    assert choose_backend("cpu", USE, said.append, checks) == "triton"
    assert checks.calls == 1 and said == []  # cached: no check, nothing said
    # another configuration of the run is checked on its own
    assert choose_backend("cpu", KernelUse(32, 64, "bf16", True, 0.0, False), said.append, checks) == "triton"
    assert checks.calls == 2


@pytest.mark.parametrize("times,choice", [({"triton": 1.2, "torch": 2.5}, "triton"),
                                          ({"triton": 3.1, "torch": 2.0}, "torch")])
def test_auto_takes_the_faster_backend_and_caches_the_choice_with_both_times(times, choice):
    """After a pass, both backends are timed at the run's shape; the faster runs, the line says both times, and a
    later run takes the cached choice without checking or timing again."""
    said, checks, timed = [], Checks([case(True)]), []

    def timer(use, device):
        timed.append((use.batch, use.seq))
        return times

    use = KernelUse(64, 768, "bf16", False, 0.1, False, seq=512, batch=16)
    assert choose_backend("cpu", use, said.append, checks, timer) == choice
    assert timed == [(16, 512)] and len(said) == 2
    assert f"Triton {times['triton']:.2f} ms, PyTorch {times['torch']:.2f} ms" in said[1]
    assert ("uses PyTorch" if choice == "torch" else "uses Triton") in said[1]
    entry, = json.loads((cache_dir() / "kernel_checks.json").read_text()).values()
    assert entry["choice"] == choice and entry["times_ms"] == times
    said.clear()
    assert choose_backend("cpu", use, said.append, checks, timer) == choice
    assert checks.calls == 1 and len(timed) == 1 and said == []


def test_a_timing_error_keeps_the_checked_kernels_and_says_so():
    def broken(use, device):
        raise RuntimeError("CUDA error: launch timeout")

    said = []
    assert choose_backend("cpu", USE, said.append, Checks([case(True)]), broken) == "triton"
    assert "timing both failed (RuntimeError: CUDA error: launch timeout)" in said[1]


def test_a_cached_pass_for_another_triton_is_checked_again():
    checks = Checks([case(True)])
    choose_backend("cpu", USE, lambda m: None, checks)
    cache = cache_dir() / "kernel_checks.json"
    known = json.loads(cache.read_text())
    (key, verdict), = known.items()
    other = json.loads(key)
    other["triton"] = "0.0.1"
    cache.write_text(json.dumps({json.dumps(other, sort_keys=True): verdict}))
    assert choose_backend("cpu", USE, lambda m: None, checks) == "triton" and checks.calls == 2


@pytest.mark.parametrize("result,named", [
    ([case(True), case(False, "dx: error 3e-2 > 2 x 1e-3")], "layer_norm rows bf16 dropout 0.1"),
    (RuntimeError("PTXAS error: register allocation failed"), "RuntimeError: PTXAS error"),
])
def test_a_failed_check_falls_back_to_torch_with_one_warning(result, named):
    said, checks = [], Checks(result)
    assert choose_backend("cpu", USE, said.append, checks) == "torch"
    assert len(said) == 2 and said[1].startswith("warning:") and named in said[1]
    assert "--kernels torch" in said[1] and "bertkit check-gpu" in said[1]
    assert not (cache_dir() / "kernel_checks.json").exists()  # a failure is never cached: the next run checks again
    assert choose_backend("cpu", USE, said.append, checks) == "torch" and checks.calls == 2


def test_auto_on_the_cpu_and_forced_triton_never_check(monkeypatch):
    """The guard is for `auto` on CUDA only: on the CPU auto is torch already; --kernels triton stays forced."""
    import torch

    from bertkit import kernels
    from bertkit.kernel_guard import resolve_guarded

    monkeypatch.setattr("bertkit.kernel_guard.choose_backend", lambda *a, **k: pytest.fail("checked"))
    kernels.use("auto")
    try:
        assert resolve_guarded(torch.device("cpu"), [USE]) == "torch"
    finally:
        kernels.use(os.environ.get("BERTKIT_KERNELS", "auto"))


def test_auto_under_compile_on_cuda_takes_torch_for_bert_and_still_checks_modernbert(monkeypatch):
    """--compile on CUDA: a BERT encoder's layers go to PyTorch's ops (measured faster compiled), said once, no
    check; a ModernBERT layer (RoPE, a window: PyTorch's path would attend over the whole band) is still checked."""
    import torch

    from bertkit import kernels
    from bertkit.kernel_guard import COMPILED_BERT_ON_CUDA, resolve_guarded

    checked = []
    monkeypatch.setattr("bertkit.kernel_guard.choose_backend", lambda device, use, say: checked.append(use) or "triton")
    monkeypatch.setattr(kernels, "resolve", lambda device: "triton")  # as on a GPU
    modern = KernelUse(64, 768, "bf16", True, 0.0, True, rope_theta=10000.0, window=64, layer_norm=False)
    monkeypatch.setattr("bertkit.kernel_guard._said_compiled", False)
    cuda, said = torch.device("cuda"), []
    try:
        kernels.use("auto")
        assert resolve_guarded(cuda, [USE], said.append, compiled=True) == "torch"
        assert said == [COMPILED_BERT_ON_CUDA] and not checked and kernels.backend() == "torch"
        kernels.use("auto")
        assert resolve_guarded(cuda, [USE], said.append, compiled=True) == "torch" and len(said) == 1  # said once
        kernels.use("auto")
        assert resolve_guarded(cuda, [USE], said.append) == "triton" and checked == [USE]  # eager: checked, timed
        kernels.use("auto")
        assert resolve_guarded(cuda, [modern], said.append, compiled=True) == "triton" and checked[-1] == modern
        kernels.use("triton")  # forced stays forced
        assert resolve_guarded(cuda, [USE], said.append, compiled=True) == "triton" and len(said) == 1
    finally:
        kernels.use(os.environ.get("BERTKIT_KERNELS", "auto"))


def test_the_uses_of_an_electra_pair_cover_both_models():
    from bertkit.models.bert_config import BertConfig
    from bertkit.models.electra import ElectraForPreTraining

    model = ElectraForPreTraining(BertConfig.preset("tiny", vocab_size=64, norm="post"))
    uses = kernel_uses(model, "bf16", True)
    assert [(u.head_dim, u.hidden) for u in uses] == [(64, 128), (32, 32)]
    assert all(u.varlen and u.dtype == "bf16" and not u.prenorm for u in uses)


def test_the_uses_of_a_modernbert_are_its_global_and_its_local_attention():
    from bertkit.models.modernbert import ModernBertConfig, ModernBertForMaskedLM

    cfg = ModernBertConfig.preset("tiny", vocab_size=64, attention_dropout=0.1)
    uses = kernel_uses(ModernBertForMaskedLM(cfg), "bf16", True)
    assert [(u.rope_theta, u.window) for u in uses] == [(160_000.0, None), (10_000.0, 64)]
    assert all(u.head_dim == 64 and u.dropout == 0.1 and u.varlen and not u.layer_norm for u in uses)


@pytest.mark.slow
def test_the_guard_checks_rotary_and_windowed_attention_under_the_interpreter(tmp_path):
    """A ModernBERT run's checks: RoPE with and without the band pass; with the kernels' window off they fail."""
    script = """
import importlib
from bertkit.kernel_guard import KernelUse, run_checks
use = KernelUse(head_dim=32, hidden=64, dtype="fp32", varlen=True, dropout=0.0, prenorm=True, rope_theta=10000.0,
                window=64, layer_norm=False)
cases = run_checks(use, "cpu")
print("cases", len(cases), all(c.passed for c in cases), {c.config["window"] for c in cases})
attn = importlib.import_module("bertkit.kernels.attention")
real = attn.flash_attn_forward
attn.flash_attn_forward = lambda *a, **k: real(*a, **{**k, "window": None})
print("broken", all(not c.passed for c in run_checks(use, "cpu")))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TRITON_INTERPRET="1", BERTKIT_CACHE_DIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"cases [1-9]\d* True \{16\}", r.stdout) and "broken True" in r.stdout, r.stdout


@pytest.mark.slow
def test_the_real_checks_under_the_interpreter_pass_and_catch_a_wrong_gradient(tmp_path):
    """The guard's own checks on the CPU under TRITON_INTERPRET=1 (small shapes): every case of a pre-LN run passes;
    with the LayerNorm backward's residual gradient off by 1 % they fail, and the run would use torch."""
    script = """
import importlib, sys
from bertkit.kernel_guard import KernelUse, choose_backend, run_checks
use = KernelUse(head_dim=32, hidden=64, dtype="fp32", varlen=sys.argv[1] == "varlen", dropout=0.1, prenorm=True)
cases = run_checks(use, "cpu")
print("cases", len(cases), all(c.passed for c in cases))
layer_norm = importlib.import_module("bertkit.kernels.layer_norm")  # check-gpu's cases import it when they run
original = layer_norm.add_ln_backward
def wrong(*args, **kwargs):
    dh, dx, dw, db = original(*args, **kwargs)
    return dh * 1.01, dx, dw, db
layer_norm.add_ln_backward = wrong
said = []
print("backend", choose_backend("cpu", use, said.append), said[-1][:60])
"""
    for layout in ("padded", "varlen"):
        r = subprocess.run([sys.executable, "-c", script, layout], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, TRITON_INTERPRET="1", BERTKIT_CACHE_DIR=str(tmp_path / layout)))
        assert r.returncode == 0, r.stderr[-3000:]
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("cases", "backend")))
        count, ok = lines["cases"].split()
        assert int(count) >= 4 and ok == "True", r.stdout
        assert lines["backend"].startswith("torch warning: the Triton kernels failed their check"), r.stdout
