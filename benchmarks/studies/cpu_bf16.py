"""bf16 on the CPU: one training step (forward, backward, fused AdamW) of bertkit's models in fp32 and under
`--precision bf16` (autocast over fp32 weights, bertkit.precision), A/B in one process, the two alternated so that
both see the same machine. A CPU with bf16 matrix units (Intel AMX / AVX-512 BF16) multiplies bf16 matrices 5-7x
faster than fp32 ones; how much of that a step keeps depends on how much of the step is matrix products.

    python benchmarks/studies/cpu_bf16.py                                 # the table; results/cpu_bf16.json
    python benchmarks/studies/cpu_bf16.py --models bert:tiny modernbert:mini --tokens 4096 --length 64

Packed batches of documents of exactly --length tokens (as `--recipe budget` instances), 15 % predicted, dropout 0;
the median of --steps steps after a warm-up, for each of --rounds alternations.
"""
import argparse
import statistics

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
from benchlib import time_steps
from record import run_info, write_result

from bertkit.precision import autocast, cpu_bf16_units

VOCAB = 16_000


def build(family: str, preset: str):
    if family == "modernbert":
        from bertkit.models.modernbert import ModernBertConfig, ModernBertForMaskedLM

        cfg = ModernBertConfig.preset(preset, vocab_size=VOCAB, max_position_embeddings=512)
        for name in [k for k in vars(cfg) if k.endswith("dropout")]:
            setattr(cfg, name, 0.0)
        return ModernBertForMaskedLM(cfg)
    from bertkit.models import build_pretraining
    from bertkit.models.bert_config import BertConfig

    cfg = BertConfig.preset(preset, vocab_size=VOCAB)
    cfg.hidden_dropout = cfg.attention_dropout = 0.0
    return build_pretraining(cfg.to_dict(), "mlm")


def measure(family: str, preset: str, tokens: int, length: int, steps: int, rounds: int) -> dict:
    torch.manual_seed(0)
    model = build(family, preset).train()
    docs = tokens // length
    ids = torch.randint(5, VOCAB, (docs * length,))
    cu = (torch.arange(docs + 1) * length).to(torch.int32)
    positions = torch.nonzero(torch.rand(ids.shape) < 0.15).squeeze(1)
    batch = dict(input_ids=ids, cu_seqlens=cu, max_seqlen=length, mlm_positions=positions, mlm_labels=ids[positions])
    if family == "bert":
        batch["token_type_ids"] = torch.zeros_like(ids)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(precision):
        with autocast("cpu", precision):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds = {"fp32": [], "bf16": []}
    for _ in range(rounds):
        for precision in seconds:  # a warm-up (autocast's first casts), then the median of the steps
            seconds[precision].append(time_steps(lambda: step(precision), steps, "cpu"))
    fp32, bf16 = (statistics.median(seconds[p]) for p in ("fp32", "bf16"))
    return {"model": f"{family}:{preset}", "tokens": docs * length, "length": length,
            "parameters": sum(p.numel() for p in model.parameters()), "fp32_s": fp32, "bf16_s": bf16,
            "speedup": fp32 / bf16, "every_round": seconds}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["bert:tiny", "modernbert:tiny", "bert:mini", "modernbert:mini",
                                                    "bert:small", "modernbert:small"])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {**run_info("cpu_bf16"), "threads": args.threads, "bf16_units": cpu_bf16_units(), "rows": []}
    print(f"bf16 matrix units on this CPU: {result['bf16_units']}; {args.threads} thread(s)")
    print(f"{'model':18} {'params':>8} {'tokens':>6} {'fp32 s':>7} {'bf16 s':>7} {'speed-up':>8}")
    for name in args.models:
        family, preset = name.split(":")
        row = measure(family, preset, args.tokens, args.length, args.steps, args.rounds)
        result["rows"].append(row)
        print(f"{name:18} {row['parameters'] / 1e6:7.1f}M {row['tokens']:6} {row['fp32_s']:7.3f} {row['bf16_s']:7.3f} "
              f"{row['speedup']:7.2f}x", flush=True)
    write_result("cpu_bf16", result)


if __name__ == "__main__":
    main()
