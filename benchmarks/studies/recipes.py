"""Beyond BERT's 2018 recipe, measured on the transfer benchmark's budget (benchmarks/studies/pretrain_transfer.py;
benchmarks/lib/transfer.py is what they share): the same English corpus, tokenizer, preset and steps, one pretraining
per arm, then the same fine-tunes with the same seeds.

Arms: nsp-15 (BERT's recipe: the transfer benchmark's dynamic run, reused), sop-15 (ALBERT's sentence order),
none-15 (RoBERTa's full sentences, MLM only), nsp-30 (30% masking, Wettig et al. 2023).

    python benchmarks/studies/recipes.py [--tasks sst2 mrpc stsb] [--seeds 1 2 3] [--device cuda] [--steps N]
    python benchmarks/studies/recipes.py --tasks sst2 stsb --finetune-lr 5e-4  # the arms at another rate
    python benchmarks/studies/recipes.py --speed  # CPU step times: --pad-vocab-to 64, packed fine-tuning (SST-2, SQuAD)

Resumable; prints tables; writes benchmarks/results/recipes.json (and recipes_speed.json).
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, done, say
from record import RESULTS, best_ms, run_info, write_result
from transfer import BUDGETS, curves, finetune_one, finetune_rate, prepare, pretrain_run, task_metric

ARMS = {"nsp-15": dict(objective="nsp", masked_lm_prob=0.15), "sop-15": dict(objective="sop", masked_lm_prob=0.15),
        "none-15": dict(objective="none", masked_lm_prob=0.15), "nsp-30": dict(objective="nsp", masked_lm_prob=0.30)}


def instances_for(work: Path, arm: str, en: dict) -> Path:
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances

    if arm == "nsp-15":
        return en["dynamic"]
    out = work / f"en-dynamic-{arm}"
    if not done(out):
        say(f"make-instances {arm}")
        make_instances(en["corpus"], en["tokenizer"], out,
                       InstancesConfig.from_flags(dict(max_seq_length=128, mode="dynamic", dupe=1, workers=2,
                                                       **ARMS[arm])),
                       progress=False)
    return out


def recipes(args):
    budget = BUDGETS[args.device]
    steps = args.steps or budget.steps
    en = prepare(args.work, "en", budget)
    # another length keeps its own runs and results; BERT's arm at a longer length is the transfer benchmark's
    # --long-steps run (en-run-dynamic-N) and its fine-tunes, reused
    suffix = "" if steps == budget.steps else f"-{steps}"
    state_file = args.work / f"recipes{suffix}.json"
    results = json.loads(state_file.read_text()) if state_file.is_file() else {}
    transfer = args.work / "results.json"
    transfer_used_dynamic = transfer.is_file() and json.loads(transfer.read_text()).get("finetuned_from") == "dynamic"
    finetune_budget, lr_tag, folder_tag = finetune_rate(budget, args.finetune_lr)
    for arm in ARMS:
        run = args.work / ("en-run-dynamic" if arm == "nsp-15" else f"en-run-{arm}")
        run = run.with_name(run.name + suffix)
        model = pretrain_run(instances_for(args.work, arm, en), run, budget, steps, args.device)
        entry = results.setdefault(arm, {"curve": curves(run), "scores": {}})
        entry["curve"] = curves(run)
        for task in args.tasks:
            for seed in args.seeds:
                key = f"{task}{lr_tag}/{seed}"
                if key in entry["scores"]:
                    continue
                out = args.work / "finetune" / f"{task}-{arm}-{seed}{suffix}{folder_tag}"
                if arm == "nsp-15" and suffix:
                    out = args.work / "finetune" / f"{task}-{steps}-{seed}{folder_tag}"
                elif arm == "nsp-15" and transfer_used_dynamic:  # the transfer benchmark's fine-tunes of this model
                    out = args.work / "finetune" / f"{task}-pretrained-{seed}{folder_tag}"
                t0 = time.time()
                summary = finetune_one(task, model, out, seed, finetune_budget, args.work)
                entry["scores"][key] = summary["best"][task_metric(task)]
                say(f"{arm} {task}{lr_tag} seed {seed}: {entry['scores'][key]:.4f} ({time.time() - t0:.0f} s)")
                state_file.write_text(json.dumps(results, indent=1))
    # every task and rate fine-tuned so far, in the order first met
    tasks = list(dict.fromkeys(key.rsplit("/", 1)[0] for entry in results.values() for key in entry["scores"]))
    rows = []
    for arm, entry in results.items():
        row = {"arm": arm, **ARMS[arm], "steps": steps, "eval_mlm_acc": entry["curve"]["eval_mlm_acc"][-1],
               "eval_mlm_mask_acc": (entry["curve"].get("eval_mlm_mask_acc") or [None])[-1],
               # NSP's or SOP's held-out accuracy; none for MLM alone
               "eval_sentence_acc": (entry["curve"].get("eval_nsp_acc") or entry["curve"].get("eval_sop_acc")
                                     or [None])[-1],
               "seq_per_s": entry["curve"].get("seq_per_s")}
        for task in tasks:
            scores = [v for k, v in entry["scores"].items() if k.startswith(task + "/")]
            if scores:
                row[task] = {"mean": statistics.mean(scores), "seeds": scores,
                             "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0}
        rows.append(row)

    def percent(x, width):
        return f"{100 * x:{width - 1}.1f}%" if x is not None else f"{'-':>{width}}"

    print(f"\n{'arm':8} {'MLM acc':>8} {'[MASK] acc':>10} {'NSP/SOP':>8} {'seq/s':>6} "
          + " ".join(f"{t + ' ' + task_metric(t):>18}" for t in tasks))
    for r in rows:
        cells = " ".join(f"{100 * r[t]['mean']:10.1f} ± {100 * r[t]['sd']:4.1f}" if t in r else f"{'-':>18}"
                         for t in tasks)
        print(f"{r['arm']:8} {percent(r['eval_mlm_acc'], 8)} {percent(r['eval_mlm_mask_acc'], 10)} "
              f"{percent(r['eval_sentence_acc'], 8)} {r['seq_per_s'] or 0:6.0f} {cells}")
    write_result("recipes" + suffix.replace("-", "_"), {**run_info("recipes"), "budget": budget.__dict__,
                                                        "tasks": tasks, "seeds": args.seeds, "rows": rows})


def speed(args):
    """Pretraining step time with the vocabulary rows padded to a multiple of 1, 8 (the default) or 64; SST-2 and
    SQuAD fine-tuning steps padded and packed. The CPU, fp32, best of several timed steps after warm-up ones."""
    import torch

    rows = squad_speed() if "squad" in args.speed_rows else []
    rows += vocab_speed() if "vocab" in args.speed_rows else []
    rows += sst2_speed() if "sst2" in args.speed_rows else []
    base = {}
    print(f"\n{'what':52} {'setting':>14} {'ms/step':>9} {'speed-up':>8}")
    for r in rows:
        setting = f"pad {r['pad_vocab_to']} ({r['rows']})" if "pad_vocab_to" in r else \
            ("packed" if r["packed"] else "padded")
        key = r["what"]
        base.setdefault(key, r["ms"])
        print(f"{key:52} {setting:>14} {r['ms']:9.1f} {base[key] / r['ms']:7.2f}x")
    info = {**run_info("recipes_speed"), "torch": torch.__version__, "threads": torch.get_num_threads()}
    path = RESULTS / "recipes_speed.json"
    before = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    timed = {r["what"] for r in rows}  # rows not timed this time stay, each with the run info it was timed under
    kept = [{"run": {k: v for k, v in before.items() if k != "rows"}, **r} for r in before["rows"]
            if r["what"] not in timed]
    write_result("recipes_speed", {**info, "rows": kept + [{**r, "run": info} for r in rows]})


def vocab_speed() -> list[dict]:
    """A mini pretraining step with the vocabulary's rows padded to 1, 8 or 64."""
    import torch
    from benchlib import make_batch

    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    rows = []
    # bert-base's 30522 rows become 30528 with the default multiple of 8 and with 64 alike, so it is measured
    # unpadded (1) against 64; bert-base-chinese's 21128 is a multiple of 8 but not of 64
    for vocab, pad in ((30522, 1), (30522, 64), (21128, 8), (21128, 64)):
        batch = make_batch(32, 128, vocab)
        torch.manual_seed(0)
        cfg = BertConfig.preset("mini", vocab_size=vocab, vocab_pad_multiple=pad)
        model = BertForPreTraining(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        rows.append({"what": f"pretrain step, mini, vocab {vocab}, batch 32 x 128", "pad_vocab_to": pad,
                     "rows": cfg.padded_vocab_size, "ms": best_ms(step, 5, warmup=2)})
    return rows


def sst2_speed() -> list[dict]:
    """SST-2 fine-tuning steps (mini and base, random weights), padded and packed, on 640 training sentences."""
    import random

    import torch

    from bertkit.finetune.classify import encode, label_ids, label_list
    from bertkit.finetune.glue import read_glue
    from bertkit.finetune.train import collate_features as ft_collate, pack_features as collate_packed
    from bertkit.models.bert import BertForSequenceClassification
    from bertkit.models.bert_config import BertConfig
    from bertkit.tokenization import load_tokenizer

    tokenizer = load_tokenizer(SHARED / "vocab" / "bert-base-uncased" / "vocab.txt")
    train, _ = read_glue("sst2", SHARED / "glue", "train")
    train = random.Random(0).sample(train, 32 * 20)
    labels = label_list(train)
    features = encode(train, tokenizer, 128, label_ids(train, labels, "SST-2"))
    batches = [features[i:i + 32] for i in range(0, len(features), 32)]
    rows = []
    for preset in ("mini", "base"):
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig.preset(preset, vocab_size=30522), len(labels))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        n = 4 if preset == "base" else 20
        for packed in (False, True):
            def epoch():
                for rows_ in batches[:n]:
                    b = collate_packed(rows_) if packed else ft_collate(rows_)
                    model(**b).loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            ms = best_ms(epoch, 2, warmup=2) / n
            tokens = sum(len(r["input_ids"]) for rows_ in batches[:n] for r in rows_)
            slots = sum(max(len(r["input_ids"]) for r in rows_) * len(rows_) for rows_ in batches[:n])
            rows.append({"what": f"SST-2 fine-tune step, {preset}, batch 32", "packed": packed, "ms": ms,
                         "padding_efficiency": 1.0 if packed else tokens / slots})
    return rows


def squad_speed(batches: int = 4) -> list[dict]:
    """SQuAD fine-tuning steps of all-MiniLM-L6-v2 (the parity benchmark's model), padded and packed
    (`finetune squad --unpadded`), on 32-window batches drawn (seed 0) from the training windows of dev articles 0-5
    at the command's defaults (384 tokens, windows 128 apart, 64-token questions)."""
    import random

    import torch

    from bertkit.finetune.squad import feature_dicts, make_features, read_squad
    from bertkit.finetune.train import collate_features as ft_collate, pack_features as collate_packed
    from bertkit.models import load_pretrained
    from bertkit.testing import minilm_dir as model_dir
    from bertkit.tokenization import load_tokenizer

    examples, _ = read_squad(SHARED / "squad_v1.1" / "dev-v1.1.json", training=True, articles=slice(0, 6))
    features = feature_dicts(make_features(examples, load_tokenizer(model_dir()), True), True)
    order = random.Random(0).sample(range(len(features)), 32 * batches)
    chosen = [[features[i] for i in order[b * 32:(b + 1) * 32]] for b in range(batches)]
    rows = []
    for packed in (False, True):
        torch.manual_seed(0)
        model = load_pretrained(model_dir(), head="question_answering").train()
        opt = torch.optim.AdamW(model.parameters(), lr=5e-5)

        def epoch():
            for rows_ in chosen:
                b = collate_packed(rows_) if packed else ft_collate(rows_)
                model(**b).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        ms = best_ms(epoch, 2, warmup=1) / batches
        tokens = sum(len(r["input_ids"]) for rows_ in chosen for r in rows_)
        slots = sum(max(len(r["input_ids"]) for r in rows_) * len(rows_) for rows_ in chosen)
        rows.append({"what": "SQuAD fine-tune step, all-MiniLM-L6-v2, 32 windows", "packed": packed, "ms": ms,
                     "padding_efficiency": 1.0 if packed else tokens / slots})
    return rows


def main(argv=None):
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-transfer")
    ap.add_argument("--tasks", nargs="+", default=["sst2", "mrpc", "stsb"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=None,
                    help="pretraining steps per arm (default: the budget's); past the unigram plateau the arms can "
                         "differ by more than noise (BERT's arm reuses pretrain_transfer.py --long-steps N)")
    ap.add_argument("--finetune-lr", type=float, default=None,
                    help="fine-tuning learning rate (default: the budget's); another rate gets its own rows")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--speed-rows", nargs="+", choices=["vocab", "sst2", "squad"], default=["vocab", "sst2", "squad"],
                    help="which --speed rows to time")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="the transfer benchmark's budget to use")
    args = ap.parse_args(argv)
    if args.speed:
        speed(args)
    else:
        recipes(args)


if __name__ == "__main__":
    main()
