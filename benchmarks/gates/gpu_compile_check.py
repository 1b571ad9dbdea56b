"""Does `bertkit finetune --compile` run on this GPU? A check for a lent GPU's session (gpu_session.sh compile).

On an H200 (2026-11-27, torch 2.11) `finetune classify --compile` stopped at its first step with inductor's
"NotImplementedError: SliceView" while the pretraining step compiled (benchmarks/gates/pretrain_step.py: full
128/512-token batches). On 2026-11-28 the trace (bertkit.errors.compile_failure made to re-raise) named searchsorted
over the sliced cu_seqlens[1:]; with the whole tensor searched every variant passed (benchmarks/results/gates.md). This
runs the same command on a small random BERT and random sentences of uneven lengths in each layout, so a failing one,
and with TORCHDYNAMO_VERBOSE its op, shows:

    python benchmarks/gates/gpu_compile_check.py --out gpu_out/compile_check.json

Variants: packed (fine-tuning's default) and padded batches under --compile (auto: PyTorch's ops under --compile),
packed with --kernels triton, and eager --kernels auto (the Triton check and timing, and how long they take).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from gpulib import no_gpu

REPO = Path(__file__).resolve().parents[2]
ALIGNED = "packed, compiled, 64-token rows"
VARIANTS = {
    "packed, compiled": ["--compile"],
    # every row 62 words + [CLS] + [SEP]: each batch 64 wide, a multiple of 16. If this passes where uneven rows
    # fail, suspect inductor padding SDPA's mask to an aligned width and slicing it back (lengths round to 8 here)
    ALIGNED: ["--compile"],
    "padded, compiled": ["--compile", "--padded"],
    "packed, compiled, triton": ["--compile", "--kernels", "triton"],
    "packed, eager, auto": [],
}


def make_inputs(root: Path, words_per_row: int | None = None) -> tuple[Path, Path, Path]:
    """A random BERT (4 layers x 256, head size 64) over a 1,005-token vocabulary, and 1,024 / 256 sentences of
    5-61 words (or words_per_row each) whose label says which half of the vocabulary they draw from (learnable,
    so the loss must fall)."""
    import torch

    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    root.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(1000)]
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    torch.manual_seed(0)
    cfg = BertConfig.preset("mini", vocab_size=len(words) + 5)
    model = save_pretrained(BertForPreTraining(cfg), root / "model", tokenizer_dir=root)
    rng = random.Random(0)
    files = []
    for name, rows in (("train", 1024), ("dev", 256)):
        lines = ["sentence\tlabel"]
        for _ in range(rows):
            label = rng.randint(0, 1)
            pool = words[:500] if label else words[500:]
            lines.append(" ".join(rng.choices(pool, k=words_per_row or rng.randint(5, 61))) + f"\t{label}")
        (root / f"{name}.tsv").write_text("\n".join(lines) + "\n")
        files.append(root / f"{name}.tsv")
    return model, *files


def run(variant: list[str], model: Path, train: Path, dev: Path, out: Path, timeout: float) -> dict:
    cmd = [sys.executable, "-c", "from bertkit.cli import entry; entry()", "finetune", "classify", "--model",
           str(model), "--train-file", str(train), "--dev-file", str(dev), "--text-a", "sentence", "--epochs", "2",
           "--lr", "1e-3", "--no-save-model", "--report-to", "none", "--out", str(out), *variant]
    env = {**os.environ, "TORCHDYNAMO_VERBOSE": "1", "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        ok, text = done.returncode == 0, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:  # its output may come as bytes even with text=True
        parts = [x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr)]
        ok, text = False, "".join(parts) + f"\ntimed out after {timeout:.0f} s"
    metrics = out / "metrics.json"
    return {"ok": ok and metrics.is_file(), "seconds": round(time.perf_counter() - t0, 1),
            "metrics": json.loads(metrics.read_text()) if metrics.is_file() else None,
            "said": [line for line in text.splitlines() if line.startswith(("checking", "checked", "--compile",
                                                                           "warning"))],
            "tail": text.splitlines()[-200:] if not ok else []}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_out/compile_check.json")
    ap.add_argument("--timeout", type=float, default=100.0, help="seconds per variant")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = ap.parse_args()
    if no_gpu("gpu_compile_check.py"):  # on a CPU --compile measures nothing this check is for
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inputs = make_inputs(root)
        for name in args.variants:
            model, train, dev = make_inputs(root / "aligned", 62) if name == ALIGNED else inputs
            results[name] = run(VARIANTS[name], model, train, dev, root / name.replace(", ", "-"), args.timeout)
            r = results[name]
            score = r["metrics"] and r["metrics"].get("best", {}).get("accuracy")
            print(f"{name:28} {'ok' if r['ok'] else 'FAILED':6} {r['seconds']:6.1f} s  accuracy {score}", flush=True)
            for line in r["said"]:
                print("    " + line[:200])
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name, r in results.items():
        if not r["ok"]:
            print(f"\n== {name}: the end of its output\n" + "\n".join(r["tail"]))


if __name__ == "__main__":
    main()
