"""Is the unigram plateau bertkit's or the recipe's? Train bertkit's BertForPreTraining and transformers' on the same
micro batches of the transfer benchmark's instances, in the same plain loop (AdamW, BERT's weight-decay groups,
warmup then linear decay, clipping at 1.0; no DeepSpeed), from the same seed, and compare the MLM loss and the
accuracy on [MASK] positions every 100 steps (a benchmark: it reads results, it asserts nothing).

    python benchmarks/studies/pretrain_transfer.py --only en  # the instances (--work, default /tmp/bertkit-transfer)
    python benchmarks/studies/reference_training.py [--steps 200]
    python benchmarks/studies/reference_training.py --lrs 3e-4 5e-4 1e-3 3e-3 1e-2 --steps 500  # bertkit, per rate

Each model trains in its own process with one thread. Prints a table; writes benchmarks/results/reference_training.json
(the learning-rate sweep: reference_training_lr.json).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import run_info, write_result

TINY = dict(vocab_size=16000, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512)


def train(which: str, instances: Path, steps: int, lr: float, every: int) -> list[dict]:
    import torch

    from bertkit.data import EpochBatches, InstanceDataset, batch_loader
    from bertkit.optim import param_groups

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = InstanceDataset(instances, "train", 42)
    if which == "transformers":
        import transformers

        model = transformers.BertForPreTraining(transformers.BertConfig(
            vocab_size=TINY["vocab_size"], hidden_size=TINY["hidden_size"], num_hidden_layers=TINY["num_layers"],
            num_attention_heads=TINY["num_heads"], intermediate_size=TINY["intermediate_size"],
            max_position_embeddings=512, layer_norm_eps=1e-12))
    else:
        from bertkit.models.bert import BertForPreTraining
        from bertkit.models.bert_config import BertConfig

        model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=TINY["vocab_size"]))
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=lr, betas=(0.9, 0.999), eps=1e-6)
    warm = max(1, int(0.05 * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / warm if s < warm else (steps - s) / (steps - warm))
    batches = iter(batch_loader(data, EpochBatches(len(data), 32, 42, 0, 1), 0))
    sums, rows, t0 = [0.0, 0, 0, 0], [], time.time()
    for step in range(1, steps + 1):
        b = next(batches)
        pos, labels = b["mlm_positions"], b["mlm_labels"]
        if which == "transformers":  # its labels are per token: scatter the chosen positions' labels
            valid = labels != -100
            full = torch.full_like(b["input_ids"], -100).scatter_(1, pos * valid, torch.where(valid, labels, -100))
            out = model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                        attention_mask=b["attention_mask"], labels=full, next_sentence_label=b["next_sentence_label"])
            logits = out.prediction_logits.gather(1, pos[..., None].expand(-1, -1, TINY["vocab_size"]))
        else:
            out = model(**b)
            logits = out.mlm_logits
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            mlm_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            at_mask = (b["input_ids"].gather(1, pos) == data.mask_id) & (labels != -100)
            sums[0] += mlm_loss.item()
            sums[1] += 1
            sums[2] += ((logits.argmax(-1) == labels) & at_mask).sum().item()
            sums[3] += at_mask.sum().item()
        if step % every == 0:
            rows.append({"step": step, "mlm_loss": sums[0] / sums[1], "mask_acc": sums[2] / sums[3],
                         "seconds": time.time() - t0})
            sums = [0.0, 0, 0, 0]
    return rows


def child(which: str, lr: float, args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--one", which, "--work", str(args.work), "--steps",
                             str(args.steps), "--lr", str(lr), "--every", str(args.every)],
                            stdout=subprocess.PIPE, text=True)


def result(name: str, proc: subprocess.Popen) -> list[dict]:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{name} run failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def lr_sweep(args, instances: Path) -> None:
    """Is another learning rate a way out of the plateau? bertkit's loop at each rate, same batches and seed."""
    curves = {}
    for i in range(0, len(args.lrs), 2):  # two one-thread runs at a time: one per core
        running = {lr: child("bertkit", lr, args) for lr in args.lrs[i:i + 2]}
        curves.update({lr: result(f"lr {lr:g}", proc) for lr, proc in running.items()})
    print(f"\n{'lr':>7} " + " ".join(f"{'step ' + str(r['step']):>15}" for r in curves[args.lrs[0]]))
    for lr, rows in curves.items():
        print(f"{lr:7g} " + " ".join(f"{r['mlm_loss']:6.3f} {100 * r['mask_acc']:5.2f}%  " for r in rows))
    print("(each cell: MLM loss and [MASK]-only accuracy over the last --every steps)")
    write_result("reference_training_lr", {**run_info("reference_training_lr"), "instances": str(instances),
                                           "steps": args.steps, "micro_batch": 32, "model": TINY,
                                           "curves": {f"{lr:g}": rows for lr, rows in curves.items()}})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-transfer")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--lrs", type=float, nargs="+", help="train bertkit alone at each learning rate (two at a time)")
    ap.add_argument("--one", choices=["bertkit", "transformers"], help=argparse.SUPPRESS)  # a child process
    args = ap.parse_args(argv)
    instances = args.work / "en-dynamic"
    if args.one:
        print(json.dumps(train(args.one, instances, args.steps, args.lr, args.every)))
        return
    if not (instances / "manifest.json").is_file():
        raise SystemExit(f"{instances}: run `python benchmarks/studies/pretrain_transfer.py --only en` first")
    if args.lrs:
        return lr_sweep(args, instances)
    children = {which: child(which, args.lr, args) for which in ("bertkit", "transformers")}
    curves = {which: result(which, proc) for which, proc in children.items()}
    print(f"\n{'step':>5} {'MLM loss bertkit':>17} {'transformers':>13} {'[MASK] acc bertkit':>19} "
          f"{'transformers':>13}")
    for a, b in zip(curves["bertkit"], curves["transformers"]):
        print(f"{a['step']:5d} {a['mlm_loss']:17.4f} {b['mlm_loss']:13.4f} {100 * a['mask_acc']:18.2f}% "
              f"{100 * b['mask_acc']:12.2f}%")
    write_result("reference_training", {**run_info("reference_training"), "instances": str(instances),
                                        "steps": args.steps, "lr": args.lr, "micro_batch": 32, "model": TINY,
                                        "curves": curves})


if __name__ == "__main__":
    main()
