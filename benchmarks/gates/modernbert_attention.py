"""ModernBERT's attention on a GPU: bertkit's Triton kernels (RoPE turned inside, the local band's tiles skipped)
against FlexAttention and SDPA, global and local layers, forward + backward (needs a CUDA GPU).

    python benchmarks/gates/modernbert_attention.py [--seqs 1024 8192] [--tokens 32768] [--window 64] [--out FILE]

ModernBERT-base's shape: 12 heads of 64, bf16, packed documents of exactly S tokens (tokens / S of them). The
global layer turns q and k with RoPE base 160,000 and attends to its whole document; the local one uses base 10,000
and ±window keys. Every provider is timed on the same work, RoPE included: bertkit (kernels.attention_varlen with
rope_theta and window; `bertkit-prerot` is the same kernels with RoPE applied before them in PyTorch, to see what
turning q and k inside costs), FlexAttention (torch.compile'd flex_attention with a document + band BlockMask, RoPE
applied before it in PyTorch) and SDPA (each document a row of a padded batch; the local layer through a boolean
band mask, RoPE before it). TFLOP/s count the work actually needed: 4·H·D per visible (query, key) pair forward,
2.5x that backward, so a local layer is credited n·(2w+1), never n². The issue's goal on an H100: local ≥ 1.5x
FlexAttention at 8,192 tokens, global ≥ FlexAttention; correctness is check-gpu's (its three attention kinds).
Prints a table and writes JSON (benchmarks/results/ unless --out).
"""
import argparse
import sys
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
import torch.nn.functional as F
from gpulib import bench, environment, no_gpu, write_gpu_result

HEADS, HEAD_DIM = 12, 64
LAYERS = {"global": (160_000.0, None), "local": (10_000.0, "window")}


def visible_pairs(seq: int, window: int | None) -> int:
    """(query, key) pairs one document of `seq` tokens attends to: seq² globally, the band's area locally."""
    if window is None or window >= seq:
        return seq * seq
    full = seq * (2 * window + 1)
    edge = window * (window + 1)  # the keys that fall off either end: 1 + 2 + ... + window, twice
    return full - edge


def rotated(q, k, theta):
    from bertkit.kernels.reference import apply_rotary, rotary_tables

    cos, sin = rotary_tables(q.shape[-3] if q.dim() == 4 else q.shape[0], q.shape[-1], theta, q.device)
    return apply_rotary(q, cos[:, None], sin[:, None]), apply_rotary(k, cos[:, None], sin[:, None])


def providers(seq: int, docs: int, window: int | None, theta: float, dtype):
    """name -> a function of (q, k, v) packed (docs·seq, H, D) that returns the output (same layout)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from bertkit import kernels

    cu = torch.arange(0, docs + 1, device="cuda", dtype=torch.int32) * seq
    band = None if window is None else (
        (torch.arange(seq, device="cuda")[:, None] - torch.arange(seq, device="cuda")[None, :]).abs() <= window)

    def keep(b, h, q_idx, kv_idx):
        same = (q_idx // seq) == (kv_idx // seq)
        return same if window is None else same & ((q_idx - kv_idx).abs() <= window)

    block_mask = create_block_mask(keep, None, None, docs * seq, docs * seq, device="cuda")
    flex = torch.compile(flex_attention)

    kernels.use("triton")

    def ours(q, k, v):
        return kernels.attention_varlen(q, k, v, cu, seq, window=window, rope_theta=theta)

    def ours_prerotated(q, k, v):  # RoPE as a PyTorch pass before the kernels, as the peers get it
        q, k = rotated(q.view(docs, seq, HEADS, HEAD_DIM), k.view(docs, seq, HEADS, HEAD_DIM), theta)
        return kernels.attention_varlen(q.reshape(-1, HEADS, HEAD_DIM), k.reshape(-1, HEADS, HEAD_DIM), v, cu, seq,
                                        window=window)

    def with_flex(q, k, v):
        q, k = rotated(q.view(docs, seq, HEADS, HEAD_DIM), k.view(docs, seq, HEADS, HEAD_DIM), theta)
        q, k = q.reshape(1, docs * seq, HEADS, HEAD_DIM), k.reshape(1, docs * seq, HEADS, HEAD_DIM)
        out = flex(q.transpose(1, 2), k.transpose(1, 2), v[None].transpose(1, 2), block_mask=block_mask)
        return out.transpose(1, 2)[0]

    def with_sdpa(q, k, v):
        q, k = rotated(q.view(docs, seq, HEADS, HEAD_DIM), k.view(docs, seq, HEADS, HEAD_DIM), theta)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.view(docs, seq, HEADS, HEAD_DIM).transpose(1, 2), attn_mask=band)
        return out.transpose(1, 2).reshape(docs * seq, HEADS, HEAD_DIM)

    return {"bertkit": ours, "bertkit-prerot": ours_prerotated, "flex": with_flex, "sdpa": with_sdpa}


def measure(seq: int, tokens: int, layer: str, window: int, dtype) -> list[dict]:
    theta, windowed = LAYERS[layer]
    window = window if windowed else None
    docs = max(1, tokens // seq)
    gen = torch.Generator(device="cuda").manual_seed(seq)
    q, k, v = (torch.randn(docs * seq, HEADS, HEAD_DIM, device="cuda", dtype=dtype, generator=gen)
               for _ in range(3))
    dout = torch.randn_like(q)
    fwd_flops = 4 * HEADS * HEAD_DIM * docs * visible_pairs(seq, window)
    rows, outputs = [], {}
    for name, fn in providers(seq, docs, window, theta, dtype).items():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        try:
            out = fn(*leaves)
            outputs[name] = out.detach().float()
            out.backward(dout)
            fwd_ms = bench(lambda: fn(*leaves))
            both_ms = bench(lambda: torch.autograd.grad(fn(*leaves), leaves, dout))
            rows.append({"layer": layer, "seq": seq, "docs": docs, "window": window, "provider": name,
                         "fwd_ms": fwd_ms, "fwd_bwd_ms": both_ms, "fwd_tflops": fwd_flops / fwd_ms / 1e9,
                         "fwd_bwd_tflops": 3.5 * fwd_flops / both_ms / 1e9})
        except Exception as e:  # a peer that cannot run this case (memory, a missing kernel) is a row that says so
            rows.append({"layer": layer, "seq": seq, "docs": docs, "window": window, "provider": name,
                         "error": f"{type(e).__name__}: {str(e)[:200]}"})
        torch.cuda.empty_cache()
    if "bertkit" in outputs:
        for row in rows:
            if row["provider"] in outputs and row["provider"] != "bertkit":
                row["max_diff_vs_bertkit"] = (outputs[row["provider"]] - outputs["bertkit"]).abs().max().item()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--tokens", type=int, default=32768, help="tokens per batch (documents = tokens / seq)")
    ap.add_argument("--window", type=int, default=64, help="the local layer's ±keys (ModernBERT: 64)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if no_gpu("modernbert_attention.py"):
        return 0
    env = environment("modernbert_attention")
    rows = [r for seq in args.seqs for layer in LAYERS
            for r in measure(seq, args.tokens, layer, args.window, torch.bfloat16)]
    print(f"\n{env['device']}, bf16, {HEADS} heads x {HEAD_DIM}, {args.tokens} tokens a batch, window ±{args.window}")
    print(f"{'layer':7} {'seq':>5} {'provider':14} {'fwd ms':>8} {'f+b ms':>8} {'fwd TF/s':>9} {'f+b TF/s':>9}  "
          "vs bertkit")
    for r in rows:
        if "error" in r:
            print(f"{r['layer']:7} {r['seq']:5} {r['provider']:14} {r['error']}")
            continue
        ratio = next((o["fwd_bwd_ms"] / r["fwd_bwd_ms"] for o in rows if o["provider"] == "bertkit"
                      and o["layer"] == r["layer"] and o["seq"] == r["seq"] and "error" not in o), None)
        print(f"{r['layer']:7} {r['seq']:5} {r['provider']:14} {r['fwd_ms']:8.3f} {r['fwd_bwd_ms']:8.3f} "
              f"{r['fwd_tflops']:9.1f} {r['fwd_bwd_tflops']:9.1f}  "
              + (f"{ratio:.2f}x as fast as bertkit" if ratio and r["provider"] != "bertkit" else ""))
    write_gpu_result(env, args.out, rows=rows, window=args.window, tokens=args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
