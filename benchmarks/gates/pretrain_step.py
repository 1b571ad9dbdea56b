"""Training-step throughput and peak memory: bertkit's BertForPreTraining vs transformers' (attn_implementation="sdpa").

Same config, batch, precision and data for both: batches of realistic make-instances lengths (90% near the maximum,
10% short, as short_seq_prob=0.1 gives), padded by bertkit's loader (batch max rounded up to 8), 15% masked.
bertkit gets the masked positions (its head projects only those); transformers gets labels over every position,
which is how its BertForPreTraining computes MLM. One step = forward + backward + AdamW step.

Each (implementation, config) runs in its own process so peak memory is its own: on CUDA
torch.cuda.max_memory_allocated, on the CPU the growth of the process's peak RSS over its state before the model.

    python benchmarks/gates/pretrain_step.py                        # CPU: tiny and small at 128, batch 32
    python benchmarks/gates/pretrain_step.py --kernels torch reference   # the CPU backends side by side
    python benchmarks/gates/pretrain_step.py --device cuda --configs base --seq 128 512 --batch 128 --precision bf16
    python benchmarks/gates/pretrain_step.py --configs tiny mini base --compile   # + bertkit under torch.compile

--compile adds bertkit:BACKEND+compile (model.compile(), as pretrain --compile does); its warm-up steps, which
include compiling, are timed apart (compile_s), never in the steps per second. --graphs adds bertkit:BACKEND+graphs
(mode="reduce-overhead": on CUDA the compiled forward and backward replay as CUDA graphs; the batch's shape is fixed).
Every eager run and transformers' come first, the compiled ones after; the JSON is rewritten after each run, a run
that fails or passes --timeout is recorded as such, and --deadline stops starting new runs (a lease's minutes).
"""
import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import make_batch
from record import run_info

REPO = Path(__file__).resolve().parents[2]


def measure(impl: str, config: str, seq: int, batch: int, device: str, precision: str, steps: int, warmup: int,
            profile: str | None = None):
    """impl: transformers, or bertkit:BACKEND (auto, triton, torch: --kernels), "+compile" for torch.compile.
    profile: a folder for the torch.profiler table of 3 more steps (where the time goes), after the timed ones."""
    import torch

    from bertkit.models.bert_config import BertConfig

    torch.manual_seed(0)
    cfg = BertConfig.preset(config, vocab_size=30522, max_position_embeddings=512)
    data = {k: v.to(device) for k, v in make_batch(batch, seq, cfg.vocab_size).items()}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if impl.startswith("bertkit"):
        from bertkit import kernels
        from bertkit.models.bert import BertForPreTraining

        backend, _, compiled = impl.split(":")[1].partition("+")
        kernels.use(backend)
        impl = f"bertkit:{kernels.resolve(device)}" + (f"+{compiled}" if compiled else "")
        model = BertForPreTraining(cfg).to(device)
        if compiled:
            model.compile(mode="reduce-overhead" if compiled == "graphs" else None)

        def loss_fn():
            return model(**data).loss
    else:
        import transformers

        hf_cfg = transformers.BertConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k != "model_type"},
                                         attn_implementation="sdpa")
        model = transformers.BertForPreTraining(hf_cfg).to(device)
        assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
        labels = torch.full_like(data["input_ids"], -100)
        # padded prediction slots are (position 0, label -100); position 0 is [CLS], never a real prediction
        labels.scatter_(1, data["mlm_positions"], data["mlm_labels"])

        def loss_fn():
            return model(input_ids=data["input_ids"], token_type_ids=data["token_type_ids"],
                         attention_mask=data["attention_mask"], labels=labels,
                         next_sentence_label=data["next_sentence_label"]).loss
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # bertkit's and Trainer's
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def step():
        with torch.autocast(device_type=device, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    compile_s = time.perf_counter() - t0  # the warm-up steps: with +compile, the compiling
    if device == "cuda":
        torch.cuda.synchronize()
        if not impl.endswith("+graphs"):  # a CUDA graph's memory pool is taken at capture, in the warm-up
            torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0)
    if profile:
        from torch.profiler import ProfilerActivity, profile as profiler

        with profiler(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])) as p:
            for _ in range(3):
                step()
            if device == "cuda":
                torch.cuda.synchronize()
        by = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
        table = p.key_averages().table(sort_by=by, row_limit=40, max_name_column_width=60)
        Path(profile).mkdir(parents=True, exist_ok=True)
        (Path(profile) / f"profile-{impl.replace(':', '-').replace('+', '-')}-{config}-{seq}.txt").write_text(table)
    return {"impl": impl, "config": config, "seq": seq, "batch": batch, "device": device, "precision": precision,
            "steps": steps, "seq_per_s": batch * steps / elapsed, "ms_per_step": 1000 * elapsed / steps,
            "peak_mem_mib": peak / 2**20, "tokens_per_step": int(data["attention_mask"].sum()),
            "padded_len": int(data["input_ids"].shape[1]), "warmup_s": compile_s}


def machine(device: str) -> dict:
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": __import__("os").cpu_count(), "processor": platform.processor()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--configs", nargs="+", default=["tiny", "small"])
    ap.add_argument("--seq", nargs="+", type=int, default=[128])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--precision", default=None, choices=["fp32", "bf16", "fp16"],
                    help="default: fp32 on the CPU, bf16 on CUDA")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--kernels", nargs="+", choices=["auto", "triton", "torch", "reference"], default=None,
                    help="bertkit backends to time (default: auto on the CPU; triton and torch on CUDA)")
    ap.add_argument("--compile", action="store_true", help="also time bertkit under torch.compile")
    ap.add_argument("--graphs", action="store_true", help="also time torch.compile(mode='reduce-overhead')")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one run may take")
    ap.add_argument("--deadline", type=float, default=None, help="start no run after this many seconds")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--profile", default=None, help="folder for a torch.profiler table per run")
    ap.add_argument("--one", nargs=3, metavar=("IMPL", "CONFIG", "SEQ"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    kernels = args.kernels or (["triton", "torch"] if args.device == "cuda" else ["auto"])
    if args.one:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        impl, config, seq = args.one
        print(json.dumps(measure(impl, config, int(seq), args.batch, args.device, precision, args.steps,
                                 args.warmup, args.profile)))
        return

    runs = [(config, seq, f"bertkit:{k}") for config in args.configs for seq in args.seq for k in kernels]
    runs += [(config, seq, "transformers") for config in args.configs for seq in args.seq]
    for suffix, wanted in (("compile", args.compile), ("graphs", args.graphs)):
        runs += [(config, seq, f"bertkit:{k}+{suffix}") for config in args.configs for seq in args.seq
                 for k in kernels if wanted]
    runs.sort(key=lambda r: ("+" in r[2], args.seq.index(r[1])))  # eager at every length first, then compiled
    now = datetime.now(timezone.utc)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"pretrain_step-{args.device}-{now:%Y%m%d-%H%M%S}.json"
    record = {**run_info("pretrain_step"), "machine": machine(args.device), "precision": precision,
              "results": [], "failed": []}
    t_start = time.perf_counter()
    for config, seq, impl in runs:
        if args.deadline and time.perf_counter() - t_start > args.deadline:
            record["failed"].append({"impl": impl, "config": config, "seq": seq, "error": "not started: --deadline"})
            continue
        cmd = [sys.executable, __file__, "--one", impl, config, str(seq), "--batch", str(args.batch),
               "--device", args.device, "--precision", precision, "--steps", str(args.steps),
               "--warmup", str(args.warmup)] + (["--threads", str(args.threads)] if args.threads else []) \
            + (["--profile", args.profile] if args.profile else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            error = out.stderr[-3000:] if out.returncode else None
        except subprocess.TimeoutExpired:
            error = f"timed out after {args.timeout} s"
        if error:
            print(f"{impl} {config} seq {seq} failed:\n{error}", file=sys.stderr)
            record["failed"].append({"impl": impl, "config": config, "seq": seq, "error": error[-600:]})
        else:
            record["results"].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(record["results"][-1]), flush=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
    results = record["results"]
    print(f"\n{'config':8} {'seq':>4} {'batch':>5} {'impl':21} {'seq/s':>9} {'ms/step':>9} {'peak MiB':>9} "
          f"{'speed-up':>8} {'warm-up s':>9}")
    for r in results:
        base = next((x for x in results if x["impl"] == "transformers" and x["config"] == r["config"]
                     and x["seq"] == r["seq"]), None)
        ratio = r["seq_per_s"] / base["seq_per_s"] if base else float("nan")
        print(f"{r['config']:8} {r['seq']:>4} {r['batch']:>5} {r['impl']:21} {r['seq_per_s']:9.1f} "
              f"{r['ms_per_step']:9.1f} {r['peak_mem_mib']:9.0f} {ratio:7.2f}x {r['warmup_s']:9.1f}")
    for f in record["failed"]:
        print(f"{f['config']:8} {f['seq']:>4} {'':>5} {f['impl']:21} failed: {f['error'].splitlines()[-1][:80]}")
    print(f"\nwrote {path}")
    if any(not f["error"].startswith("not started") for f in record["failed"]):
        raise SystemExit("some runs failed (above; recorded in the JSON)")


if __name__ == "__main__":
    main()
