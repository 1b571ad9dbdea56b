"""bertkit's and transformers' SQuAD fine-tuning step for step, same weights, same batches (a diagnostic).

The parity benchmark (finetune_parity.py) compares whole runs, whose scores move by seeds; this one removes the
randomness to find where the two part: both models start from all-MiniLM-L6-v2 with the same QA head, see the same
windows (bertkit's, which equal transformers' for this split) in the same order, and each takes its own optimizer
recipe (bertkit: train._optimizer + build_scheduler; transformers: Trainer's, as finetune_peer.train_loop). The
losses per step are printed side by side; --dropout 0.1 adds dropout (then the two draw different masks and only
the trend can agree). --swap NAME replaces one of bertkit's parts by transformers' (optimizer: Trainer's AdamW and
schedule) to see what each is worth. `--task squad2` does the same on the parity grid's SQuAD v2 split (unanswerable
questions labelled [CLS]), `--task squad-large` on its larger v1.1 split; `--compare-windows` only compares the
two systems' training windows: token ids and the start/end labels, window by window.

    python benchmarks/studies/finetune_lockstep.py --steps 40
    python benchmarks/studies/finetune_lockstep.py --task squad2 --compare-windows
"""
import argparse
import collections
import math
import time

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import numpy as np
import torch
from benchlib import SHARED
from finetune_tasks import TASKS, model_dir


def masked_loss(hf, batch):
    """transformers' QA loss with padding taken out of the softmax, as bertkit's head does."""
    from bertkit.models.bert import MASKED_LOGIT

    out = hf(**{k: v for k, v in batch.items() if not k.endswith("_positions")})
    pad = batch["attention_mask"] == 0
    ce = torch.nn.functional.cross_entropy
    return (ce(out.start_logits.masked_fill(pad, MASKED_LOGIT), batch["start_positions"])
            + ce(out.end_logits.masked_fill(pad, MASKED_LOGIT), batch["end_positions"])) / 2


def compare_windows(examples, features: list, t: dict) -> None:
    """bertkit's training windows against run_qa.py's (finetune_peer.squad_train_rows), question by question: how
    many windows each makes, and where the counts agree, the token ids (transformers' padding left out) and the
    start/end labels window by window. Windows part only on long contexts: bertkit steps 128 tokens from one window's
    start to the next (google-research/bert), run_qa.py overlaps them by 128."""
    from finetune_peer import squad_train_rows, squad_windows
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir())
    windows = squad_windows(tok, examples, t)
    theirs = squad_train_rows(tok, examples, windows)
    their_example = windows["overflow_to_sample_mapping"]
    ours_by, theirs_by = collections.defaultdict(list), collections.defaultdict(list)
    for f in features:
        ours_by[f.example_index].append(f)
    for i, row in zip(their_example, theirs):
        theirs_by[int(i)].append(row)
    same_count = [i for i in range(len(examples)) if len(ours_by[i]) == len(theirs_by[i])]
    pairs = [(ours, their) for i in same_count for ours, their in zip(ours_by[i], theirs_by[i])]
    same_ids = sum(ours.input_ids == their["input_ids"][:sum(their["attention_mask"])] for ours, their in pairs)
    same_labels = sum((ours.start_position, ours.end_position) == (their["start_positions"], their["end_positions"])
                      for ours, their in pairs)
    impossible = [i for i, ex in enumerate(examples) if ex.is_impossible]
    print(f"{len(examples)} questions ({len(impossible)} unanswerable): bertkit {len(features)} windows, "
          f"transformers {len(theirs)}")
    print(f"questions with as many windows in both: {len(same_count)}; their {len(pairs)} windows: same token ids "
          f"{same_ids}, same labels {same_labels}")
    ours_null = all(f.start_position == f.end_position == 0 for i in impossible for f in ours_by[i])
    theirs_null = all(r["start_positions"] == r["end_positions"] == 0 for i in impossible for r in theirs_by[i])
    print("windows labelled [CLS] (no answer inside): bertkit "
          f"{sum(f.start_position == 0 for f in features)}, transformers "
          f"{sum(r['start_positions'] == 0 for r in theirs)}; every unanswerable question's windows at [CLS]: "
          f"bertkit {ours_null}, transformers {theirs_null}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=[k for k, t in TASKS.items() if t["kind"] == "squad"], default="squad")
    ap.add_argument("--compare-windows", action="store_true",
                    help="only compare bertkit's training windows and labels with transformers' (run_qa.py's)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--swap", choices=["optimizer"], action="append", default=[])
    ap.add_argument("--hf-loss", choices=["own", "masked"], default="own",
                    help="masked: transformers' logits scored as bertkit scores them (padding never an answer)")
    args = ap.parse_args()
    import transformers

    from bertkit.finetune.squad import feature_dicts, make_features, read_squad
    from bertkit.finetune.train import TrainConfig, _optimizer, collate_features as collate
    from bertkit.models import load_pretrained
    from bertkit.optim import build_scheduler
    from bertkit.tokenization import load_tokenizer

    torch.set_num_threads(2)
    t = TASKS[args.task]
    examples, _ = read_squad(SHARED / t["file"], True, t.get("version_2", False), slice(*t["train"]))
    features = make_features(examples, load_tokenizer(model_dir()), True)
    if args.compare_windows:
        return compare_windows(examples, features, t)
    rows = feature_dicts(features, True)
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
        theirs = {n: p.detach() for n, p in hf.named_parameters()}
        diff = max(float((p.detach()[:len(theirs[n])] - theirs[n]).abs().max())  # bertkit pads the vocabulary to 8
                   for n, p in ours.named_parameters() if n in theirs)
        print(f"{step:>4} {lr_ours:>9.2e} {lr:>9.2e} {losses[0]:>10.4f} {losses[1]:>10.4f} {norms[0]:>9.3f} "
              f"{norms[1]:>9.3f} {diff:>11.2e}", flush=True)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
