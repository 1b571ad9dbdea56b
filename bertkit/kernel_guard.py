"""`--kernels auto` on a GPU: trust the Triton kernels there only after checking them there.

A user's first GPU run is the kernels' first run on that GPU (another architecture, another Triton, a driver quirk).
So before the first step of a run that would use them, `choose_backend` checks, on the device, the configurations
this run will use (attention forward and backward at its head size, padded or packed, with its dropout; the
add+LayerNorm at its hidden size, post- or pre-LN, with its dropout; every shipped tile configuration), on small
shapes, against float64 by check-gpu's rule (error at most 2x PyTorch's own in that precision, plus 1e-5; padded rows
exact zeros). Pass: then both backends are timed on one layer (attention and add+LayerNorm, forward and backward) at
the run's own shape, and the faster one runs (Triton's fused kernels are not always faster: at 128 tokens on an
H100 its step was host-bound); the verdict, the choice and both times are cached per (GPU, compute capability,
torch, triton, bertkit, configuration) in the user's cache folder, so later runs skip the check. Fail, or any
compile or launch error: the torch backend for this run and one warning line naming the failed check and
`bertkit check-gpu` for details.
`--kernels triton` (or BERTKIT_KERNELS=triton) stays forced: no check, no fallback.
"""
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bertkit import __version__
from bertkit.models import family_of

SMALL_WINDOW = 16   # the guard's sequences are 40 tokens: a wider band would not cut


@dataclass(frozen=True)
class KernelUse:
    """What a run asks of the kernels."""
    head_dim: int
    hidden: int
    dtype: str            # fp32 | bf16 | fp16
    varlen: bool          # packed batches (--unpadded)
    dropout: float
    prenorm: bool         # --norm pre
    rope_theta: float | None = None   # ModernBERT: rotary embeddings of this base, turned inside the kernels
    window: int | None = None         # ModernBERT's local layers: ±keys a query sees
    layer_norm: bool = True           # the add+LayerNorm kernel too (ModernBERT's bias-free norms are PyTorch's)
    seq: int = 128                    # the run's shape, where the backends are timed: tokens per sequence ...
    batch: int = 32                   # ... and sequences per micro batch


def cache_dir() -> Path:
    root = os.environ.get("BERTKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "bertkit")
    return Path(root)


def _versions(device) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu, capability = props.name, f"{props.major}.{props.minor}"
    else:  # the interpreter on the CPU (tests)
        gpu, capability = f"{device.type} (Triton interpreter)", "-"
    return {"gpu": gpu, "capability": capability, "torch": torch.__version__, "triton": triton_version,
            "bertkit": __version__}


def cache_key(versions: dict, use: KernelUse) -> str:
    return json.dumps({**versions, **asdict(use)}, sort_keys=True)


def run_checks(use: KernelUse, device) -> list:
    """check-gpu's cases for what this run uses, on small shapes: every shipped attention tile configuration."""
    from bertkit.check_gpu import _attention_case, _attention_configs, _layer_norm_case, _safe

    dev, cases = str(device), []
    window = None if use.window is None else min(use.window, SMALL_WINDOW)  # the small shapes' band must cut
    for p in sorted({0.0, use.dropout}):
        for configs in _attention_configs(use.head_dim, every=True):
            cases.append(_safe(lambda: _attention_case(use.head_dim, use.dtype, use.varlen, p, configs, dev, True,
                                                       window, use.rope_theta),
                               "attention", use.dtype, "varlen" if use.varlen else "padded", p, configs))
        if use.layer_norm:
            cases.append(_safe(lambda: _layer_norm_case(use.hidden, use.dtype, p, dev, True, use.prenorm),
                               "layer_norm", use.dtype, "rows", p, {"hidden": use.hidden}))
    return cases


def kernel_uses(model, precision: str, unpadded: bool, seq: int = 128, batch: int = 32) -> list[KernelUse]:
    """What a model asks of the kernels: its encoder's shape (and for ELECTRA its generator's too), at the run's
    sequence length and micro batch."""
    model = getattr(model, "module", model)
    return [KernelUse(dtype=precision, varlen=unpadded, seq=seq, batch=batch, **shape)
            for shape in family_of(model).kernel_shapes(model)]


COMPILED_BERT_ON_CUDA = (
    "--compile on CUDA: --kernels auto takes PyTorch's SDPA and LayerNorm for a BERT encoder (BERT-base on an H200, "
    "2026-11-27: compiled, PyTorch's path ran 2.12x transformers' step at 128 tokens, Triton's 0.93x, its ops a "
    "break in what the compiler fuses; as CUDA graphs 2.12x against 2.06x at 128 and 1.70x against 1.64x at 512); "
    "--kernels triton forces ours")


_said_compiled = False  # COMPILED_BERT_ON_CUDA is said once a process (`finetune korean --task all` runs seven)


def resolve_guarded(device, uses: list[KernelUse], say=print, compiled: bool = False) -> str:
    """bertkit.kernels.resolve(device), except that `auto` on a CUDA device is checked there first
    (choose_backend); the outcome is set for the rest of this process. compiled (--compile): a BERT encoder's
    layers (no RoPE, no window) take the torch backend, measured faster there; ModernBERT's are checked and timed."""
    global _said_compiled
    from bertkit import kernels

    backend = kernels.resolve(device)
    if not uses:  # a model that calls no bertkit kernel runs, and is recorded, as torch
        return "torch"
    if kernels.backend() == "auto" and backend == "triton" and torch.device(device).type == "cuda":
        if compiled and all(u.rope_theta is None and u.window is None for u in uses):
            if not _said_compiled:
                say(COMPILED_BERT_ON_CUDA)
                _said_compiled = True
            backend = "torch"
        else:
            backend = "triton" if all(choose_backend(device, u, say) == "triton" for u in uses) else "torch"
        kernels.use(backend)
    return backend


def time_backends(use: KernelUse, device, repeats: int = 5) -> dict | None:
    """Milliseconds of one layer (attention, then add+LayerNorm when the model uses it), forward and backward, at the
    run's shape, for each backend; None where there is nothing to time against (not CUDA)."""
    import time

    from bertkit import kernels

    device = torch.device(device)
    if device.type != "cuda":
        return None
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[use.dtype]
    heads, tokens = use.hidden // use.head_dim, use.batch * use.seq
    qkv = torch.randn(tokens, 3, heads, use.head_dim, device=device, dtype=dtype, requires_grad=True)
    x = torch.randn(tokens, use.hidden, device=device, dtype=dtype, requires_grad=True)
    w = torch.ones(use.hidden, device=device, dtype=dtype, requires_grad=True)
    b = torch.zeros(use.hidden, device=device, dtype=dtype, requires_grad=True)
    lengths = torch.full((use.batch,), use.seq, dtype=torch.int32, device=device)
    cu = torch.arange(use.batch + 1, dtype=torch.int32, device=device) * use.seq
    extra = dict(window=use.window, rope_theta=use.rope_theta)

    def layer():
        q, k, v = qkv.unbind(1)
        if use.varlen:
            out = kernels.attention_varlen(q, k, v, cu, use.seq, use.dropout, None, **extra)
        else:
            out = kernels.attention(*(t.view(use.batch, use.seq, heads, use.head_dim) for t in (q, k, v)), lengths,
                                    use.dropout, None, **extra)
        out = out.reshape(tokens, use.hidden)
        if use.layer_norm:
            out = kernels.add_layer_norm(out, x, w, b, 1e-12, use.dropout)
        out.float().sum().backward()

    previous, times = kernels.backend(), {}
    try:
        for name in ("triton", "torch"):
            kernels.use(name)
            layer()  # compiles, autotunes
            layer()  # after one warm-up call the next five still averaged 3x steady state (H200, 2026-11-27)
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(repeats):
                layer()
            torch.cuda.synchronize(device)
            times[name] = 1000 * (time.perf_counter() - start) / repeats
    finally:
        kernels.use(previous)
    return times


def choose_backend(device, use: KernelUse, say=print, checks=run_checks, timer=time_backends) -> str:
    """"triton" or "torch" for --kernels auto on `device` (see the module docstring); `checks` and `timer` are
    swappable for tests. A check says that it starts, then its outcome, through `say`; a cached verdict says nothing."""
    device = torch.device(device)
    versions = _versions(device)
    key = cache_key(versions, use)
    cache = cache_dir() / "kernel_checks.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if known.get(key, {}).get("passed") is True:
        return known[key].get("choice", "triton")
    # the first run on a GPU compiles every shipped tile configuration: on an H200 over a minute of silence otherwise
    say(f"checking the Triton kernels on {versions['gpu']} at this run's shapes before its first step (once per GPU "
        "and version, then cached) ...")
    try:
        cases = checks(use, device)
        failed = [c for c in cases if not c.passed]
    except Exception as e:  # noqa: BLE001  (compiler, driver and launch errors come in every type)
        failed, cases = [f"{type(e).__name__}: {e}"[:300]], []
    if failed:
        first = failed[0]
        what = first if isinstance(first, str) else (
            f"{first.kernel} {first.layout} {first.dtype} dropout {first.dropout:g} {first.config}"
            + (f": {first.message}" if first.message else ""))
        say(f"warning: the Triton kernels failed their check on {versions['gpu']} ({what}); this run uses "
            "--kernels torch (PyTorch's SDPA and LayerNorm). Details: bertkit check-gpu")
        return "torch"
    try:
        times = timer(use, device)
    except Exception as e:  # noqa: BLE001  (an error while timing is not a wrong answer: say so, keep Triton)
        times, said = None, f"; timing both failed ({type(e).__name__}: {str(e)[:120]})"
    else:
        said = ""
    choice = "torch" if times and times["torch"] < times["triton"] else "triton"
    known[key] = {"passed": True, "cases": len(cases), "choice": choice, "times_ms": times, **versions}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        from bertkit.fileio import atomic_write_json

        atomic_write_json(cache, known)
    except OSError:
        pass  # a read-only home: the check runs again next time
    if times:
        said = (f"; one layer forward + backward at {use.batch} x {use.seq}: Triton {times['triton']:.2f} ms, "
                f"PyTorch {times['torch']:.2f} ms, so this run uses {'Triton' if choice == 'triton' else 'PyTorch'}")
    say(f"checked the Triton kernels on {versions['gpu']} ({len(cases)} cases, all within check-gpu's rule){said}; "
        f"cached in {cache}")
    return choice
