"""The peer arm of benchmarks/studies/budget.py: masked-LM pretraining as transformers' run_mlm.py builds it, for a
wall-clock budget. Its own pipeline throughout: our tokenizer folder loaded as a BertTokenizerFast, each document
tokenized with its special tokens, the token lists concatenated and cut into blocks (run_mlm's group_texts), batches
masked by DataCollatorForLanguageModeling (15 %, 80/10/10), BertForMaskedLM (the BERT-tiny shape by default) or with
--family modernbert transformers' ModernBertForMaskedLM in a bertkit preset's shape (SDPA, sparse prediction), AdamW
with no decay on biases and norms (as Trainer), clipping at 1.0, and the same budget-aware schedule bertkit's arms get
(warmup, then linear decay to 0 when the time is spent; run_mlm.py itself has only step schedules), or with --steps the
same schedule over a number of steps (budget.py --paced). One process, the machine's threads. Writes the model (HF
format, with the tokenizer files), curve.json and run.json to --out. Resumable like bertkit's arms: --out/checkpoint.pt
every --save-every-s and on SIGTERM (exit 143), and a rerun continues with the time already used (the budget.py arm
reruns it)."""
import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    length = ap.add_mutually_exclusive_group(required=True)
    length.add_argument("--budget-s", type=float, help="train for this many seconds (the schedule follows the clock)")
    length.add_argument("--steps", type=int, help="train for this many steps (the schedule follows the steps)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=float, default=0.05)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--family", choices=["bert", "modernbert"], default="bert")
    ap.add_argument("--preset", default="tiny", help="--family modernbert: bertkit's ModernBERT preset to copy")
    ap.add_argument("--eval-every-s", type=float, default=120)
    ap.add_argument("--eval-every-steps", type=int, default=500, help="with --steps")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--save-every-s", type=float, default=600)
    args = ap.parse_args()

    import datasets
    import pyarrow as pa
    import transformers

    from bertkit.pretrain.budget import lr_at

    torch.manual_seed(args.seed)
    tok = transformers.BertTokenizerFast.from_pretrained(args.tokenizer)

    def split(name):  # our corpus folder's documents as plain text, one row each (run_mlm's --train_file lines)
        texts = []
        for path in sorted(args.corpus.glob(f"{name}-*.arrow")):
            with pa.memory_map(str(path)) as source:
                texts += [" ".join(s) for s in pa.ipc.open_file(source).read_all().column("sentences").to_pylist()]
        return datasets.Dataset.from_dict({"text": texts})

    def group_texts(batch):
        ids = [i for row in batch["input_ids"] for i in row]
        n = len(ids) // args.seq * args.seq
        return {"input_ids": [ids[k:k + args.seq] for k in range(0, n, args.seq)]}

    def blocks(name):
        ds = split(name).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
        return ds.map(group_texts, batched=True, remove_columns=ds.column_names)

    train, holdout = blocks("shard"), blocks("holdout")
    collator = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
    model = build_model(args, tok, transformers)
    no_decay = [p for p in model.parameters() if p.ndim == 1]  # biases and norm weights, as Trainer leaves them
    decay = [p for p in model.parameters() if p.ndim > 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-6, fused=True)  # Trainer's default
    torch.manual_seed(args.seed)  # the held-out masking: the same draws at every evaluation
    eval_batches = [collator([holdout[i] for i in range(k, min(k + args.micro_batch, len(holdout)))])
                    for k in range(0, min(len(holdout), 10 * args.micro_batch), args.micro_batch)]
    for b in eval_batches:
        b.pop("token_type_ids", None)

    def evaluate():
        model.eval()
        with torch.no_grad():
            losses = [model(**b).loss.item() for b in eval_batches]
        model.train()
        return sum(losses) / len(losses)

    gen = torch.Generator().manual_seed(args.seed)
    checkpoint = args.out / "checkpoint.pt"
    if checkpoint.is_file():  # a stopped run: its weights, optimizer, data order, random streams and clock
        saved = torch.load(checkpoint, weights_only=True)  # plain tensors, lists and numbers
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        torch.set_rng_state(saved["rng"])
        curve, step, used, next_eval, order = (saved[k] for k in ("curve", "step", "used", "next_eval", "order"))
        print(f"peer resumed at step {step}, {used:.0f} s used", flush=True)
    else:
        curve, step, used, next_eval = [], 0, 0.0, args.eval_every_steps if args.steps else args.eval_every_s
        order = torch.randperm(len(train), generator=gen).tolist()
    t0 = time.perf_counter() - used

    def save():
        args.out.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "rng": torch.get_rng_state(), "curve": curve, "step": step, "order": order,
                    "used": time.perf_counter() - t0, "next_eval": next_eval}, tmp)
        os.replace(tmp, checkpoint)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    next_save = time.perf_counter() - t0 + args.save_every_s
    def done_share(elapsed):  # how much of the budget is spent: the schedule's clock
        return step / args.steps if args.steps else elapsed / args.budget_s

    model.train()
    while done_share(elapsed := time.perf_counter() - t0) < 1:
        if stop or elapsed >= next_save:
            save()
            if stop:
                write_so_far(args, curve, step, time.perf_counter() - t0)
                print(f"peer stopped at step {step}; run it again to resume", flush=True)
                sys.exit(143)
            next_save = elapsed + args.save_every_s
        for g in opt.param_groups:
            g["lr"] = args.lr * lr_at(done_share(elapsed), args.warmup, "linear")
        if len(order) < args.micro_batch:
            order = torch.randperm(len(train), generator=gen).tolist()
        rows = train[order[:args.micro_batch]]["input_ids"]  # one batched read, as Trainer's DataLoader does
        batch = collator([{"input_ids": ids} for ids in rows])
        batch.pop("token_type_ids", None)  # one segment; ModernBERT takes none
        del order[:args.micro_batch]
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if (step if args.steps else elapsed) >= next_eval:
            t_eval = time.perf_counter()
            curve.append({"step": step, "elapsed_s": round(t_eval - t0, 1), "eval_mlm_loss": evaluate()})
            if args.steps:  # a step budget's clock counts training only, so a pace probe reads steps per second
                t0 += time.perf_counter() - t_eval
            print(f"peer step {step}: {curve[-1]}", flush=True)
            next_eval += args.eval_every_steps if args.steps else args.eval_every_s
    if not curve or curve[-1]["step"] != step:  # the end, unless the last evaluation was already there
        curve.append({"step": step, "elapsed_s": round(time.perf_counter() - t0, 1), "eval_mlm_loss": evaluate()})
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (args.tokenizer / name).is_file():
            shutil.copyfile(args.tokenizer / name, args.out / name)
    (args.out / "curve.json").write_text(json.dumps(curve, indent=1))
    (args.out / "run.json").write_text(json.dumps({"steps": step, "time_used_s": round(time.perf_counter() - t0, 1),
                                                   "sequences": step * args.micro_batch, "train_blocks": len(train)}))
    checkpoint.unlink(missing_ok=True)


def build_model(args, tok, transformers):
    if args.family == "bert":
        return transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=tok.vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
            num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
            hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout, layer_norm_eps=1e-12))
    from bertkit.models.modernbert import ModernBertConfig

    shape = ModernBertConfig.preset(args.preset.removeprefix("modernbert-"), vocab_size=tok.vocab_size)
    shape.set_dropout(args.dropout)
    return transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **shape.to_hf_dict(), attn_implementation="sdpa", sparse_prediction=True, reference_compile=False))


def write_so_far(args, curve: list, step: int, used: float):
    """A paused peer's curve under results/ (the checkpoint holds it only as a pickle); the finished arm's entry in
    results/budget.json replaces it (delete this file then)."""
    from record import run_info, write_result

    name = f"budget_peer_{args.budget_s:.0f}s_so_far" if args.budget_s else f"budget_peer_{args.steps}steps_so_far"
    write_result(name, {**run_info(name), "status": "peer paused (resumable): no yardstick or probe yet",
                        "resume": "python benchmarks/studies/budget.py --budget BUDGET --arms peer --work WORK",
                        "budget_s": args.budget_s, "budget_steps": args.steps, "time_used_s": round(used, 1),
                        "steps": step,
                        "micro_batch": args.micro_batch, "seq": args.seq, "lr": args.lr, "curve": curve})


if __name__ == "__main__":
    main()
