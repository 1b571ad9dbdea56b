"""Named recipes (`bertkit make-instances --recipe NAME`, `bertkit pretrain --recipe NAME`): settings taken as a
whole, one part per stage. A flag given beside a recipe wins, and so does the user's DeepSpeed config where it
speaks. Each recipe was chosen by a measurement: benchmarks/README.md, "Pretraining that pays on two CPU cores"
(benchmarks/budget.py). No torch here: `bertkit --help` lists them."""

RECIPES = {
    # the quickest way off MLM's unigram plateau on a 2-core CPU, on equal wall-clock: 64-token sequences (1.6x the
    # sequences per second; the tasks' sentences are short), masked LM alone (no NSP head to share the model with),
    # no dropout (a few passes at most: nothing to regularise), 5 % warmup, 64 sequences a step (BERT's 4,096 tokens
    # per step); modernbert-tiny at 3e-3 (its best of three rates), which reaches BERT tiny's 2-hour held-out [MASK]
    # accuracy in under an hour of its pace; a BERT model under the recipe takes BERT tiny's best rate, 1e-3
    "budget": {
        "make-instances": {"max_seq_length": 64, "objective": "none", "mode": "dynamic"},
        "pretrain": {"model": "modernbert-tiny", "objective": "mlm", "dropout": 0.0, "optimizer": "adamw",
                     "lr": 3e-3, "warmup": 0.05, "micro_batch": 64},
        "family": {"bert": {"lr": 1e-3}},
    },
}


def recipe_settings(name: str, family: str | None = None) -> dict:
    """A recipe's pretrain settings for a model of `family` ("bert" or "modernbert"): its own rate where the recipe
    measured one for that family."""
    recipe = RECIPES[name]
    return {**recipe["pretrain"], **recipe.get("family", {}).get(family, {})}


def flag(name: str) -> str:
    """A config field's command-line flag: micro_batch -> --micro-batch."""
    return "--" + name.replace("_", "-")


def as_flags(settings: dict) -> str:
    """{"objective": "mlm", "dropout": 0.0} -> "--objective mlm --dropout 0", for help texts and logs."""
    return " ".join(f"{flag(key)} {value:g}" if isinstance(value, float) else f"{flag(key)} {value}"
                    for key, value in settings.items())
