"""bertkit's and transformers' SQuAD fine-tuning step for step, same weights, same batches (a diagnostic).

The parity benchmark (finetune_parity.py) compares whole runs, whose scores move by seeds; this one removes the
randomness to find where the two part: both models start from all-MiniLM-L6-v2 with the same QA head, see the same
windows (bertkit's, which equal transformers' for this split) in the same order, and each takes its own optimizer
recipe (bertkit: train._optimizer + build_scheduler; transformers: Trainer's, as finetune_peer.train_loop). The
losses per step are printed side by side; --dropout 0.1 adds dropout (then the two draw different masks and only
the trend can agree). --swap NAME replaces one of bertkit's parts by transformers' (optimizer: Trainer's AdamW and
schedule) to see what each is worth.

    python benchmarks/finetune_lockstep.py --steps 40
"""
import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))
from finetune_parity import SHARED, TASKS, model_dir  # noqa: E402


def masked_loss(hf, batch):
    """transformers' QA loss with padding taken out of the softmax, as bertkit's head does."""
    from bertkit.models.bert import MASKED_LOGIT

    out = hf(**{k: v for k, v in batch.items() if not k.endswith("_positions")})
    pad = batch["attention_mask"] == 0
    ce = torch.nn.functional.cross_entropy
    return (ce(out.start_logits.masked_fill(pad, MASKED_LOGIT), batch["start_positions"])
            + ce(out.end_logits.masked_fill(pad, MASKED_LOGIT), batch["end_positions"])) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--swap", choices=["optimizer"], action="append", default=[])
    ap.add_argument("--hf-loss", choices=["own", "masked"], default="own",
                    help="masked: transformers' logits scored as bertkit scores them (padding never an answer)")
    args = ap.parse_args()
    import transformers

    from bertkit.finetune.squad import feature_dicts, make_features, read_squad
    from bertkit.finetune.train import TrainConfig, _optimizer, collate
    from bertkit.models import load_pretrained
    from bertkit.optim import build_scheduler
    from bertkit.tokenization import load_tokenizer

    torch.set_num_threads(2)
    t = TASKS["squad"]
    examples, _ = read_squad(SHARED / t["file"], True, False, slice(*t["train"]))
    rows = feature_dicts(make_features(examples, load_tokenizer(model_dir()), True), True)
    order = np.random.default_rng(42).permutation(len(rows))
    total = math.ceil(len(rows) / args.batch_size) * t["epochs"]

    torch.manual_seed(42)
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(
        model_dir(), hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
        attn_implementation="eager")
    ours = load_pretrained(model_dir(), head="question_answering")
    ours.cfg.set_dropout(args.dropout)
    with torch.no_grad():  # the same new head in both
        ours.qa_outputs.weight.copy_(hf.qa_outputs.weight)
        ours.qa_outputs.bias.copy_(hf.qa_outputs.bias)

    def hf_optimizer(model):
        no_decay = ("bias", "LayerNorm.weight")
        groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
                   "weight_decay": t["weight_decay"]},
                  {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
                   "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=t["lr"], eps=1e-8, fused=True)  # Trainer's default since torch 2.8
        return opt, transformers.get_linear_schedule_with_warmup(opt, math.ceil(t["warmup_ratio"] * total), total)

    cfg = TrainConfig(out_dir="-", learning_rate=t["lr"], weight_decay=t["weight_decay"])
    if "optimizer" in args.swap:
        opt_ours, sched_ours = hf_optimizer(ours)
    else:
        opt_ours = _optimizer(ours, cfg)
        sched_ours = build_scheduler(opt_ours, total, int(t["warmup_ratio"] * total), "linear")
    opt_hf, sched_hf = hf_optimizer(hf)
    ours.train()
    hf.train()
    print(f"{len(rows)} windows, {total} steps in the full run; {args.steps} here, dropout {args.dropout}, "
          f"swapped: {args.swap or 'nothing'}")
    print(f"{'step':>4} {'lr ours':>9} {'lr hf':>9} {'loss ours':>10} {'loss hf':>10} {'|g| ours':>9} {'|g| hf':>9}"
          f" {'max|w diff|':>11}")
    t0 = time.perf_counter()
    for step in range(args.steps):
        idx = order[(step * args.batch_size) % len(rows):][:args.batch_size]
        batch = collate([rows[i] for i in idx])
        losses, norms = [], []
        for model, opt, sched in ((ours, opt_ours, sched_ours), (hf, opt_hf, sched_hf)):
            loss = model(**batch).loss if model is ours or args.hf_loss == "own" else masked_loss(hf, batch)
            loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), t["max_grad_norm"])))
            losses.append(loss.item())
            lr = sched.get_last_lr()[0]
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if model is ours:
                lr_ours = lr
        theirs = dict(hf.named_parameters())
        diff = max(float((p.detach()[:len(theirs[n])] - theirs[n]).abs().max())  # bertkit pads the vocabulary to 8
                   for n, p in ours.named_parameters() if n in theirs)
        print(f"{step:>4} {lr_ours:>9.2e} {lr:>9.2e} {losses[0]:>10.4f} {losses[1]:>10.4f} {norms[0]:>9.3f} "
              f"{norms[1]:>9.3f} {diff:>11.2e}", flush=True)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
