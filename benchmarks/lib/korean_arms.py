"""What the Korean studies share (korean_transfer, korean_embeddings): a pretraining arm (family and vocabulary),
the Korean corpus, the arm's tokenizer and the budget recipe's instances, the arm's pretraining settings, and a
random start in its architecture."""
import shutil
from dataclasses import dataclass
from pathlib import Path

from benchlib import SHARED, done, say
from transfer import random_init

PRESETS = {"bert": "tiny", "modernbert": "modernbert-tiny"}


@dataclass(frozen=True)
class Arm:
    """One pretraining arm: a family and a vocabulary (train-tokenizer --pretokenize). Its folders and starts carry
    a prefix (modernbert-, mecab-, ...); BERT with the plain vocabulary keeps the benchmark's first names."""
    family: str = "bert"
    pretokenize: str = "none"

    @property
    def preset(self) -> str:
        return PRESETS[self.family]

    @property
    def vocab(self) -> str:
        return "" if self.pretokenize == "none" else f"{self.pretokenize}-"

    @property
    def prefix(self) -> str:
        return ("" if self.family == "bert" else f"{self.family}-") + self.vocab

    @property
    def unpadded(self) -> bool:
        """Its fine-tunes pack their batches (`finetune`'s default: the same losses as padded, a third of NSMC's
        compute); only BERT's plain-vocabulary arm stays padded (`--padded`), as its first scores were made."""
        return self.prefix != ""


VOCAB_SIZE = 16000
KO_TEXT = ["wikipedia_ko_wikiextractor", "wikipedia_ko_wikiextractor_more", "koconovel/data/jsonl",
           "boddari/unesco_report/in_txt"]


def prepare(work: Path, arm: Arm) -> dict:
    """Corpus, the arm's tokenizer and the budget recipe's instances; each skipped when already made."""
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
    from bertkit.recipes import RECIPES

    d = {"corpus": work / "ko-corpus", "tokenizer": work / f"ko-{arm.vocab}tokenizer",
         "instances": work / f"ko-{arm.vocab}instances"}
    if not done(d["corpus"]):
        say("prepare-corpus")
        prepare_corpus([SHARED / p for p in KO_TEXT], d["corpus"], CorpusConfig(workers=2, holdout=0.01,
                                                                                  progress=False))
    if not done(d["tokenizer"]):
        say(f"train-tokenizer --pretokenize {arm.pretokenize}")
        train_tokenizer(d["corpus"], d["tokenizer"], TokenizerConfig(vocab_size=VOCAB_SIZE, progress=False,
                                                                     pretokenize=arm.pretokenize))
    if not done(d["instances"]):
        say("make-instances --recipe budget")
        make_instances(d["corpus"], d["tokenizer"], d["instances"],
                       InstancesConfig(**{**RECIPES["budget"]["make-instances"], "dupe": 1, "workers": 2}),
                       progress=False)
    return d


def pretrain_config(instances: Path, out: Path, steps: int, arm: Arm, **extra):
    from bertkit.pretrain import PretrainConfig

    # lr 1e-3 for both families: the rate every recorded arm here ran at (the budget recipe now gives modernbert 3e-3);
    # fp32 as every recorded arm and pace probe (auto is bf16 on a CPU with bf16 units since 2026-11-27)
    return PretrainConfig(instances=str(instances), out=str(out), model=arm.preset, recipe="budget", lr=1e-3,
                          max_steps=steps, num_workers=1, progress=False, log_every=50, precision="fp32", **extra)


def random_start(work: Path, instances: Path, arm: Arm) -> Path:
    """Random weights in the pretraining run's architecture, with its tokenizer: a one-step run's export,
    re-initialised (seed 0), so the random side needs no pretraining."""
    import torch

    from bertkit.models import build_pretraining, describe, load_pretrained, save_pretrained
    from bertkit.pretrain import export, pretrain

    prefix = arm.prefix
    shape_run, shape_export = work / f"ko-{prefix}shape-run", work / f"ko-{prefix}shape-export"
    if not (shape_export / "model.safetensors").is_file():
        shutil.rmtree(shape_run, ignore_errors=True)
        pretrain(pretrain_config(instances, shape_run, 1, arm, eval_every=10 ** 9, save_every=10 ** 9))
        export(shape_run, shape_export)
    out = work / f"ko-{prefix}random"
    if arm.family == "bert":
        return random_init(shape_export, out)  # BERT's initialisation, as the first scores were made
    if not (out / "model.safetensors").is_file():
        shape = describe(load_pretrained(shape_export, head="pretraining"))
        torch.manual_seed(0)
        save_pretrained(build_pretraining(shape, "mlm"), out, tokenizer_dir=shape_export)
    return out
