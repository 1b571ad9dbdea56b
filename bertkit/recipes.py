"""Named recipes (`bertkit make-instances --recipe NAME`, `bertkit pretrain --recipe NAME`): settings taken as a
whole, one part per stage. A flag given beside a recipe wins, and so does the user's DeepSpeed config where it
speaks. Each recipe was chosen by a measurement: benchmarks/README.md, "Pretraining that pays on two CPU cores"
(benchmarks/budget.py). No torch here: `bertkit --help` lists them."""

RECIPES = {
    # the quickest way off MLM's unigram plateau on a 2-core CPU, on equal wall-clock: 64-token sequences (1.6x the
    # sequences per second; the tasks' sentences are short), masked LM alone (no NSP head to share the model with),
    # no dropout (a few passes at most: nothing to regularise), AdamW at 1e-3 (3e-4 and 3e-3 stay on the plateau
    # longer), 5 % warmup; 64 sequences a step keep BERT's 4,096 tokens per step
    "budget": {
        "make-instances": {"max_seq_length": 64, "objective": "none", "mode": "dynamic"},
        "pretrain": {"objective": "mlm", "dropout": 0.0, "optimizer": "adamw", "lr": 1e-3, "warmup": 0.05,
                     "micro_batch": 64},
    },
}


def flag(name: str) -> str:
    """A config field's command-line flag: micro_batch -> --micro-batch."""
    return "--" + name.replace("_", "-")


def as_flags(settings: dict) -> str:
    """{"objective": "mlm", "dropout": 0.0} -> "--objective mlm --dropout 0", for help texts and logs."""
    return " ".join(f"{flag(key)} {value:g}" if isinstance(value, float) else f"{flag(key)} {value}"
                    for key, value in settings.items())
