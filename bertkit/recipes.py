"""Named recipes (`bertkit make-instances --recipe NAME`, `bertkit pretrain --recipe NAME`): settings taken as a
whole, one part per stage. A flag given beside a recipe wins, and so does the user's DeepSpeed config where it
speaks. Each recipe was chosen by a measurement: docs/studies/2026-11-24-budget.md
(benchmarks/studies/budget.py). No torch here: `bertkit --help` lists them."""

# what pretrain takes where neither a flag, the user's DeepSpeed config nor a recipe says (the one place they are
# written: the dataclasses and the help texts read them here)
DEFAULTS = {"lr": 1e-3, "warmup": 0.01}

RECIPES = {
    # the quickest way off MLM's unigram plateau on a 2-core CPU, on equal wall-clock: 64-token sequences (1.6x the
    # sequences per second; the tasks' sentences are short), masked LM alone (no NSP head to share the model with),
    # no dropout (a few passes at most: nothing to regularise), 5 % warmup, 64 sequences a step (BERT's 4,096 tokens
    # per step); modernbert-tiny at 3e-3 (its best of three rates), which reaches BERT tiny's 2-hour held-out [MASK]
    # accuracy in under an hour of its pace; a family's spec may hold its own measured settings (BERT's: lr 1e-3)
    "budget": {
        "make-instances": {"max_seq_length": 64, "objective": "none", "mode": "dynamic"},
        "pretrain": {"model": "modernbert-tiny", "objective": "mlm", "dropout": 0.0, "optimizer": "adamw",
                     "lr": 3e-3, "warmup": 0.05, "micro_batch": 64},
    },
}


def recipe_settings(name: str, family=None) -> dict:
    """A recipe's pretrain settings for a model of `family` (a bertkit.models.Family): the family's own settings
    where its spec holds some measured for this recipe."""
    return {**RECIPES[name]["pretrain"], **(family.recipe_overrides.get(name, {}) if family else {})}


def flag(name: str) -> str:
    """A config field's command-line flag: micro_batch -> --micro-batch."""
    return "--" + name.replace("_", "-")


def as_flags(settings: dict) -> str:
    """{"objective": "mlm", "dropout": 0.0} -> "--objective mlm --dropout 0", for help texts and logs."""
    return " ".join(f"{flag(key)} {value:g}" if isinstance(value, float) else f"{flag(key)} {value}"
                    for key, value in settings.items())
