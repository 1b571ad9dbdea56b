"""A ModernBERT pretraining step on this CPU: bertkit's (packed: no padding, each document attending only to itself)
against transformers' ModernBertForMaskedLM on the same documents padded to the longest in the batch, the same
shape, fp32, forward + backward + AdamW, 30 % of the tokens masked (sparse prediction in both). Issue 37's goal: at
least 2x at 128, 512 and 1,024 tokens.

    python benchmarks/gates/modernbert_step.py                   # prints the table, writes results/modernbert_step.json
    python benchmarks/gates/modernbert_step.py --lengths 128 --steps 3
    python benchmarks/gates/modernbert_step.py --device cuda --lengths 1024,8192 --tokens 32768 --kernels triton,torch

Documents have lengths drawn uniformly from [L/4, L] (real corpora mix short and long ones), as many per batch as
make about --tokens real tokens; fused AdamW in both. Run it on an otherwise idle machine; the load average is
recorded. On a GPU (--device cuda: bf16 autocast, synchronised timing) bertkit runs once per --kernels backend (triton:
RoPE and the local window inside the attention kernels; torch: SDPA over each layer's padded grid).
"""
import argparse

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
from benchlib import time_steps
from record import run_info, write_result

from bertkit.models.modernbert import ModernBertConfig, ModernBertForMaskedLM, hf_state_dict

VOCAB = 16000


def documents(length: int, tokens: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    docs, total = [], 0
    while total < tokens:
        n = int(torch.randint(length // 4, length + 1, (1,), generator=g))
        docs.append(torch.randint(5, VOCAB, (n,), generator=g))
        total += n
    return docs


def masked(ids: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    labels = torch.full_like(ids, -100)
    pick = torch.rand(ids.shape, generator=g) < 0.3
    labels[pick] = ids[pick]
    return labels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="128,512,1024")
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--tokens", type=int, default=4096, help="real tokens per batch")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--kernels", default="auto", help="bertkit's backends, comma-separated (cuda: triton,torch)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from bertkit import kernels

    dev, dtype = args.device, torch.bfloat16 if args.device == "cuda" else None

    cfg = ModernBertConfig.preset(args.preset, vocab_size=VOCAB, max_position_embeddings=8192)
    result = {**run_info("modernbert_step"), "preset": args.preset, "threads": args.threads, "device": dev,
              "gpu": torch.cuda.get_device_name() if dev == "cuda" else None, "rows": []}
    print(f"{'tokens':>7} {'docs':>5} {'real tokens':>11} {'peer slots':>10} {'backend':>8} {'bertkit s':>10} "
          f"{'peer s':>8} {'speed-up':>8}")
    for length in map(int, args.lengths.split(",")):
        torch.manual_seed(0)
        ours = ModernBertForMaskedLM(cfg).train()
        peer = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
            **cfg.to_hf_dict(), attn_implementation="sdpa", sparse_prediction=True, reference_compile=False)).train()
        peer.load_state_dict(hf_state_dict(ours), strict=False)
        ours, peer = ours.to(dev), peer.to(dev)
        docs = documents(length, args.tokens, length)
        g = torch.Generator().manual_seed(1)
        packed = torch.cat(docs)
        cu = torch.tensor([0] + [len(d) for d in docs]).cumsum(0).to(torch.int32)
        labels = masked(packed, g)
        width = max(len(d) for d in docs)
        padded = torch.zeros(len(docs), width, dtype=torch.long)
        attention = torch.zeros_like(padded)
        padded_labels = torch.full_like(padded, -100)
        for i, d in enumerate(docs):
            padded[i, :len(d)], attention[i, :len(d)] = d, 1
            padded_labels[i, :len(d)] = labels[cu[i]:cu[i + 1]]
        packed, cu, labels, padded, attention, padded_labels = (
            t.to(dev) for t in (packed, cu, labels, padded, attention, padded_labels))
        # fused in both: bertkit's trainer and transformers' Trainer (its default since torch 2.8) alike
        opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True)
        opt_peer = torch.optim.AdamW(peer.parameters(), lr=1e-4, fused=True)
        max_seqlen = width  # a host-side bound, as the loader gives it: no device sync inside the step

        def step_ours():
            with torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
                loss = ours(packed, cu_seqlens=cu, max_seqlen=max_seqlen, labels=labels).loss
            loss.backward()
            opt_ours.step()
            opt_ours.zero_grad(set_to_none=True)

        def step_peer():
            with torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
                loss = peer(input_ids=padded, attention_mask=attention, labels=padded_labels).loss
            loss.backward()
            opt_peer.step()
            opt_peer.zero_grad(set_to_none=True)

        peer_s = time_steps(step_peer, args.steps, dev)
        for backend in args.kernels.split(","):
            kernels.use(backend)
            ours_s = time_steps(step_ours, args.steps, dev)
            row = {"length": length, "documents": len(docs), "real_tokens": int(packed.numel()),
                   "peer_slots": int(padded.numel()), "backend": kernels.resolve(packed.device), "bertkit_s": ours_s,
                   "peer_s": peer_s, "speedup": peer_s / ours_s}
            result["rows"].append(row)
            print(f"{length:>7} {len(docs):>5} {row['real_tokens']:>11} {row['peer_slots']:>10} "
                  f"{row['backend']:>8} {ours_s:>10.3f} {peer_s:>8.3f} {row['speedup']:>7.2f}x", flush=True)
    write_result("modernbert_step", result)


if __name__ == "__main__":
    main()
