"""`bertkit check-gpu`: before a long run, prove the Triton kernels right on this GPU and time them against PyTorch.

1. Correctness: every shipped attention tile configuration (forward, dK/dV, dQ; kernels/attention.py's lists) and
   the LayerNorm kernel at every preset's hidden size, padded and varlen, with and without dropout, in each dtype,
   against the float64 reference given the kernels' own dropout mask. FlashAttention's rule: the kernel's error is at
   most 2x that of PyTorch computing in the same precision (the reference with upcast=False), plus 1e-5. Padded
   rows and their gradients must be exact zeros.
2. Speed at BERT's shapes (batch x seq 128 x 128 and 32 x 512, 12 heads of 64, hidden 768): Triton against SDPA's
   backends (flash, cuDNN, memory-efficient: whichever accept the inputs) and F.layer_norm plus the add, as TFLOP/s
   and GB/s and as fractions of this GPU's measured copy bandwidth and matmul peak.
3. A verdict: the --kernels to use. Everything goes to a JSON file too.

Without CUDA it says so and stops (exit 0). `device="cpu"` under TRITON_INTERPRET=1 with `small=True` runs the same
code on tiny shapes (the tests do).
"""
import json
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from bertkit.models.bert_config import PRESETS

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HIDDENS = tuple(sorted({hidden for _, hidden, _ in PRESETS.values()}))


@dataclass
class CheckConfig:
    device: str = "cuda"
    dtypes: tuple = ("bf16", "fp16")
    head_dims: tuple = (64,)              # BERT's at every preset size
    hiddens: tuple = HIDDENS              # LayerNorm: every preset's hidden size
    every_config: bool = True             # each shipped tile configuration, not only the default one
    timing: bool = True
    small: bool = False                   # tiny shapes (the Triton interpreter, tests)
    dropout: float = 0.1
    out: str | None = None                # a JSON report file; None: written nowhere (--json prints it)
    timing_shapes: tuple = ((128, 128), (32, 512))   # (batch, seq)


@dataclass
class CaseResult:
    kernel: str                 # attention | layer_norm
    dtype: str
    layout: str                 # padded | varlen | rows
    dropout: float
    config: dict                # the tile configuration(s) forced, or the hidden size
    errors: dict                # output/gradient -> [kernel error, PyTorch-in-this-precision error] vs float64
    zeros_ok: bool
    passed: bool
    message: str = ""


# ---------------------------------------------------------------- correctness

def _max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def _rule(errors: dict) -> bool:
    return all(ours <= 2 * theirs + 1e-5 for ours, theirs in errors.values())


def _attention_configs(head_dim: int, every: bool) -> list[dict]:
    """One dict {fwd, dkdv, dq} per run: together the runs cover every shipped configuration of each kernel."""
    from bertkit.kernels.attention import DKDV_CONFIGS, DQ_CONFIGS, FWD_CONFIGS, block_d_for, dim_class

    dim = dim_class(block_d_for(head_dim))
    lists = {"fwd": FWD_CONFIGS[dim], "dkdv": DKDV_CONFIGS[dim], "dq": DQ_CONFIGS[dim]}
    runs = max(len(v) for v in lists.values()) if every else 1
    return [{name: configs[i % len(configs)] for name, configs in lists.items()} for i in range(runs)]


def _attention_case(head_dim, dtype_name, varlen, p, configs, device, small, window=None,
                    rope_theta=None) -> CaseResult:
    """window / rope_theta: ModernBERT's local band and rotary embeddings (None: BERT's attention)."""
    from bertkit.kernels.attention import dropout_mask, flash_attn_backward, flash_attn_forward, forced_configs
    from bertkit.kernels.common import draw_seed
    from bertkit.kernels.reference import attention_reference, attention_varlen_reference

    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device=device).manual_seed(head_dim + 7 * varlen + int(100 * p))
    heads, seq = (2, 40) if small else (12, 512)
    full = [seq, 1, seq // 2 + 3, 0] if small else [seq, 1, 300, 0, 128, 77, seq, 200]
    lengths = torch.tensor(full, device=device, dtype=torch.int32)
    batch = len(full)
    lead = (int(lengths.sum()),) if varlen else (batch, seq)
    qkv = torch.randn(*lead, 3, heads, head_dim, device=device, generator=gen, dtype=torch.float64)
    dout = torch.randn(*lead, heads, head_dim, device=device, generator=gen, dtype=torch.float64)
    seqinfo = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32) if varlen else lengths
    seed = draw_seed(device)
    mask = dropout_mask(seed, batch * heads, seq, p).view(batch, heads, seq, seq) if p > 0 else None

    def reference(leaf, upcast):
        q, k, v = leaf.unbind(-3)
        if varlen:
            return attention_varlen_reference(q, k, v, seqinfo, seq, p, None, mask, upcast, window, rope_theta)
        return attention_reference(q, k, v, lengths, p, None, mask, upcast, window, rope_theta)

    grads = {}
    for name, data, upcast in (("exact", qkv.to(dtype).double(), True), ("torch", qkv.to(dtype), False)):
        leaf = data.clone().requires_grad_()
        out = reference(leaf, upcast)
        out.backward(dout.to(out.dtype))
        grads[name] = (out.detach(), leaf.grad)

    q, k, v = qkv.to(dtype).unbind(-3)
    scale = 1.0 / math.sqrt(head_dim)
    with forced_configs(**configs):
        out, lse = flash_attn_forward(q, k, v, seqinfo, seed, seq, varlen, p, scale, window=window,
                                      rope_theta=rope_theta)
        dq, dk, dv = flash_attn_backward(dout.to(dtype), q, k, v, out, lse, seqinfo, seed, seq, varlen, p, scale,
                                         window=window, rope_theta=rope_theta)
    ours = {"out": out, "dq": dq, "dk": dk, "dv": dv}
    exact = {"out": grads["exact"][0], **dict(zip(("dq", "dk", "dv"), grads["exact"][1].unbind(-3)))}
    low = {"out": grads["torch"][0], **dict(zip(("dq", "dk", "dv"), grads["torch"][1].unbind(-3)))}
    errors = {k: [_max_err(ours[k], exact[k]), _max_err(low[k], exact[k])] for k in ours}
    zeros_ok = True
    if not varlen:  # padded rows and their gradients: exact zeros
        valid = torch.arange(seq, device=device)[None, :] < lengths[:, None]
        zeros_ok = all(bool((t[~valid] == 0).all()) for t in ours.values())
    passed = _rule(errors) and zeros_ok
    return CaseResult("attention", dtype_name, "varlen" if varlen else "padded", p,
                      {k: list(v) for k, v in configs.items()} | {"head_dim": head_dim, "window": window,
                                                                  "rope_theta": rope_theta},
                      errors, zeros_ok, passed)


def _layer_norm_case(hidden, dtype_name, p, device, small, prenorm=False) -> CaseResult:
    """prenorm: the pre-LN form, whose sum h is also an output with its own incoming gradient."""
    from bertkit.kernels.common import draw_seed
    from bertkit.kernels.layer_norm import add_ln_backward, add_ln_forward, ln_dropout_mask, tile_shape
    from bertkit.kernels.reference import add_layer_norm_reference

    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device=device).manual_seed(hidden + int(100 * p))
    rows = 37 if small else 32 * 128
    x, res, dy, dh_in = (torch.randn(rows, hidden, device=device, generator=gen, dtype=torch.float64)
                         for _ in range(4))
    w = 1 + 0.1 * torch.randn(hidden, device=device, generator=gen, dtype=torch.float64)
    b = 0.1 * torch.randn(hidden, device=device, generator=gen, dtype=torch.float64)
    seed = draw_seed(device)
    mask = ln_dropout_mask(seed, rows, hidden, p) if p > 0 else None

    results = {}
    for name, cast, compute in (("exact", dtype, torch.float64), ("torch", dtype, dtype)):
        leaves = [t.to(cast).to(compute).requires_grad_() for t in (x, res, w, b)]
        y, h = add_layer_norm_reference(leaves[0], leaves[1], leaves[2], leaves[3], 1e-12, p, prenorm=True,
                                        dropout_mask=mask)
        torch.autograd.backward([y, h] if prenorm else [y], [dy.to(compute), dh_in.to(compute)][:1 + prenorm])
        results[name] = [y.detach()] + [t.grad for t in leaves]
    xs, rs, ws, bs = (t.to(dtype) for t in (x, res, w, b))
    y, h, mean, rstd = add_ln_forward(xs, rs, ws, bs, seed, 1e-12, p)
    dh, dx, dw, db = add_ln_backward(dy.to(dtype), h, ws, mean, rstd, seed, p,
                                     dh_in=dh_in.to(dtype) if prenorm else None)
    ours = {"y": y, "dx": dx if p > 0 else dh, "dresidual": dh, "dweight": dw, "dbias": db}
    errors = {k: [_max_err(o, e), _max_err(t, e)]
              for k, o, e, t in zip(ours, ours.values(), results["exact"], results["torch"])}
    return CaseResult("layer_norm", dtype_name, "rows", p, {"hidden": hidden, "tile": list(tile_shape(hidden)),
                                                            "prenorm": prenorm}, errors, True, _rule(errors))


def attention_kinds(small: bool) -> tuple:
    """(window, rope_theta) of each attention the models use: BERT's; ModernBERT's global layer (RoPE, base
    160,000) and its local one (RoPE, base 10,000, a ±64 band; ±16 on the small shapes, so that it cuts)."""
    return (None, None), (None, 160_000.0), (16 if small else 64, 10_000.0)


def correctness(cfg: CheckConfig, device: str, progress=print) -> list[CaseResult]:
    cases = []
    for dtype in cfg.dtypes:
        for p in (0.0, cfg.dropout):
            for head_dim in cfg.head_dims:
                for varlen in (False, True):
                    for window, theta in attention_kinds(cfg.small):
                        for configs in _attention_configs(head_dim, cfg.every_config):
                            cases.append(_safe(lambda: _attention_case(head_dim, dtype, varlen, p, configs, device,
                                                                       cfg.small, window, theta),
                                               "attention", dtype, "varlen" if varlen else "padded", p, configs))
                            progress(_line(cases[-1]))
            for hidden in cfg.hiddens:
                for prenorm in (False, True):  # post-LN (BERT) and pre-LN (--norm pre: the sum is an output too)
                    cases.append(_safe(lambda: _layer_norm_case(hidden, dtype, p, device, cfg.small, prenorm),
                                       "layer_norm", dtype, "rows", p, {"hidden": hidden, "prenorm": prenorm}))
                    progress(_line(cases[-1]))
    return cases


def _safe(run, kernel, dtype, layout, p, config) -> CaseResult:
    """A case that fails to compile or launch is a failed case, with the error, not a crash of the whole check."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001  (compiler and driver errors come in every type)
        return CaseResult(kernel, dtype, layout, p, {k: list(v) if isinstance(v, tuple) else v
                                                     for k, v in config.items()}, {}, False, False,
                          f"{type(e).__name__}: {e}"[:500])


def _line(c: CaseResult) -> str:
    worst = max(c.errors.items(), key=lambda kv: kv[1][0] / (2 * kv[1][1] + 1e-5), default=("-", [0, 0]))
    what = f"{c.kernel:<10} {c.dtype:<4} {c.layout:<6} p={c.dropout:<4} {json.dumps(c.config):<58}"
    status = "ok  " if c.passed else "FAIL"
    detail = c.message or f"worst {worst[0]}: {worst[1][0]:.2e} vs torch {worst[1][1]:.2e}"
    return f"  {status} {what} {detail}"


# ---------------------------------------------------------------- speed

def _timer(device: str):
    """fn -> milliseconds per call (CUDA: triton's do_bench; CPU: the best of a few wall-clock runs)."""
    if device.startswith("cuda"):
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50)

    def cpu(fn):
        fn()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1e3 * min(times)
    return cpu


def machine_peaks(device: str, small: bool, dtype: torch.dtype) -> dict:
    """Measured copy bandwidth (GB/s) and matmul throughput (TFLOP/s) of this device."""
    bench = _timer(device)
    n = (1 << 20) if small else (1 << 28)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    copy_ms = bench(lambda: b.copy_(a))
    m = 256 if small else 8192
    x = torch.randn(m, m, device=device).to(dtype)
    mm_ms = bench(lambda: x @ x)
    return {"copy_gb_s": 2 * n / copy_ms / 1e6, "matmul_tflop_s": 2 * m ** 3 / mm_ms / 1e9,
            "matmul_dtype": str(dtype).replace("torch.", "")}


def _sdpa_backends():
    from torch.nn.attention import SDPBackend

    return {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa-math": SDPBackend.MATH}


def timing(cfg: CheckConfig, device: str, peaks: dict) -> list[dict]:
    """Attention and LayerNorm, forward and forward+backward, Triton against PyTorch, full-length batches."""
    from torch.nn.attention import sdpa_kernel

    from bertkit.kernels.attention import attention_triton
    from bertkit.kernels.layer_norm import add_layer_norm_triton

    bench = _timer(device)
    dtype = DTYPES[cfg.dtypes[0]]
    size = DTYPES[cfg.dtypes[0]].itemsize
    heads, head_dim, hidden = (2, 64, 128) if cfg.small else (12, 64, 768)
    shapes = ((2, 32),) if cfg.small else cfg.timing_shapes
    rows = []
    for batch, seq in shapes:
        qkv = torch.randn(batch, seq, 3, heads, head_dim, device=device).to(dtype).requires_grad_()
        lengths = torch.full((batch,), seq, dtype=torch.int32, device=device)
        fwd_flops = 4 * batch * heads * seq * seq * head_dim
        io_bytes = 4 * batch * seq * heads * head_dim * size  # q, k, v read, o written

        def attn_triton():
            return attention_triton(*qkv.unbind(2), lengths)

        impls = {"triton": attn_triton}
        for name, backend in _sdpa_backends().items():
            def run(backend=backend):
                with sdpa_kernel(backend):
                    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
                    return F.scaled_dot_product_attention(q, k, v)
            impls[name] = run
        for name, fn in impls.items():
            rows.append(_time_pair("attention", name, (batch, seq), fn, bench, fwd_flops, 3.5 * fwd_flops,
                                   io_bytes, peaks))

        x, res = (torch.randn(batch * seq, hidden, device=device).to(dtype).requires_grad_() for _ in range(2))
        w = torch.ones(hidden, device=device, dtype=dtype, requires_grad=True)
        bias = torch.zeros(hidden, device=device, dtype=dtype, requires_grad=True)
        ln_bytes = 3 * batch * seq * hidden * size  # x, residual read, y written
        impls = {"triton": lambda: add_layer_norm_triton(x, res, w, bias),
                 "torch": lambda: F.layer_norm(x + res, (hidden,), w, bias, 1e-12)}
        for name, fn in impls.items():
            rows.append(_time_pair("layer_norm", name, (batch, seq), fn, bench, None, None, ln_bytes, peaks))
    return rows


def _time_pair(kernel, impl, shape, fn, bench, fwd_flops, total_flops, fwd_bytes, peaks) -> dict:
    row = {"kernel": kernel, "impl": impl, "batch": shape[0], "seq": shape[1]}
    try:
        with torch.no_grad():
            row["fwd_ms"] = bench(fn)

        def fwd_bwd():
            out = fn()
            out.backward(torch.ones_like(out))
        row["fwd_bwd_ms"] = bench(fwd_bwd)
    except Exception as e:  # noqa: BLE001  (an SDPA backend that refuses these inputs)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return row
    row["fwd_gb_s"] = fwd_bytes / row["fwd_ms"] / 1e6
    row["fwd_copy_fraction"] = row["fwd_gb_s"] / peaks["copy_gb_s"]
    if fwd_flops:
        row["fwd_tflop_s"] = fwd_flops / row["fwd_ms"] / 1e9
        row["fwd_bwd_tflop_s"] = total_flops / row["fwd_bwd_ms"] / 1e9
        row["fwd_matmul_fraction"] = row["fwd_tflop_s"] / peaks["matmul_tflop_s"]
    return row


# ---------------------------------------------------------------- verdict

def verdict(cases: list[CaseResult], rows: list[dict]) -> tuple[str, str]:
    """(the --kernels to use, why)."""
    failed = [c for c in cases if not c.passed]
    if failed:
        return "torch", (f"{len(failed)} of {len(cases)} kernel checks FAILED on this GPU: use --kernels torch, and "
                         "attach the JSON to a bug report")
    slower = []
    for kernel in ("attention", "layer_norm"):
        for shape in sorted({(r["batch"], r["seq"]) for r in rows if r["kernel"] == kernel}):
            group = [r for r in rows if r["kernel"] == kernel and (r["batch"], r["seq"]) == shape and "error" not in r]
            ours = next((r for r in group if r["impl"] == "triton"), None)
            others = [r for r in group if r["impl"] != "triton"]
            if ours and others:
                best = min(others, key=lambda r: r["fwd_bwd_ms"])
                if ours["fwd_bwd_ms"] > 1.05 * best["fwd_bwd_ms"]:
                    slower.append(f"{kernel} {shape[0]}x{shape[1]}: {ours['fwd_bwd_ms']:.3f} ms vs "
                                  f"{best['impl']} {best['fwd_bwd_ms']:.3f} ms")
    if slower:
        return "torch", "the Triton kernels are correct but slower here: " + "; ".join(slower)
    return "auto", (f"all {len(cases)} checks passed" + (" and Triton is at least as fast as PyTorch" if rows else ""))


def check_gpu(cfg: CheckConfig, progress=print) -> dict:
    """Run the checks; returns (and writes to cfg.out) the report."""
    import platform

    from bertkit import __version__, kernels

    report = {"bertkit": __version__, "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
              "python": platform.python_version(), "platform": platform.platform(), "device": cfg.device,
              "config": asdict(cfg)}
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        report.update(cuda=False, kernels="torch",
                      verdict="no CUDA GPU here: nothing to check; --kernels auto uses PyTorch's ops on this machine")
        return _finish(report, cfg, progress)
    if kernels.resolve(cfg.device) != "triton":
        report.update(kernels="torch", verdict=f"the Triton kernels cannot run on {cfg.device} (triton missing, or "
                                               "the CPU without TRITON_INTERPRET=1)")
        return _finish(report, cfg, progress)
    if cfg.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(cfg.device)
        report["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                         "memory_gib": round(props.total_memory / 2**30, 1), "sms": props.multi_processor_count}
    progress(f"check-gpu: {report.get('gpu', {}).get('name', cfg.device)}, torch {report['torch']}, "
             f"triton {report['triton']}")
    progress("correctness (FlashAttention's rule: error <= 2x PyTorch's in the same precision + 1e-5, vs float64):")
    cases = correctness(cfg, cfg.device, progress)
    report["cases"] = [asdict(c) for c in cases]
    report["passed"] = sum(c.passed for c in cases)
    report["failed"] = len(cases) - report["passed"]
    rows = []
    if cfg.timing:
        peaks = machine_peaks(cfg.device, cfg.small, DTYPES["bf16" if cfg.device.startswith("cuda") else "fp32"])
        report["peaks"] = peaks
        progress(f"speed (copy {peaks['copy_gb_s']:.0f} GB/s, matmul {peaks['matmul_tflop_s']:.1f} TFLOP/s "
                 f"{peaks['matmul_dtype']}, measured):")
        rows = timing(cfg, cfg.device, peaks)
        report["timing"] = rows
        for r in rows:
            progress(_timing_line(r))
    report["kernels"], report["verdict"] = verdict(cases, rows)
    return _finish(report, cfg, progress)


def _timing_line(r: dict) -> str:
    head = f"  {r['kernel']:<10} {r['impl']:<15} {r['batch']:>4} x {r['seq']:<4}"
    if "error" in r:
        return f"{head} not available ({r['error']})"
    text = f"{head} fwd {r['fwd_ms']:8.3f} ms {r['fwd_gb_s']:7.0f} GB/s ({r['fwd_copy_fraction']:.0%} of copy)"
    if "fwd_tflop_s" in r:
        text += f" {r['fwd_tflop_s']:6.1f} TFLOP/s ({r['fwd_matmul_fraction']:.0%} of matmul)"
    text += f" | fwd+bwd {r['fwd_bwd_ms']:8.3f} ms"
    if "fwd_bwd_tflop_s" in r:
        text += f" {r['fwd_bwd_tflop_s']:6.1f} TFLOP/s"
    return text


def _finish(report: dict, cfg: CheckConfig, progress) -> dict:
    progress(f"verdict: {report['verdict']}\n  use: --kernels {report['kernels']}")
    if cfg.out:
        from bertkit.fileio import atomic_write_json

        atomic_write_json(cfg.out, report)
        progress(f"wrote {cfg.out}")
    return report

