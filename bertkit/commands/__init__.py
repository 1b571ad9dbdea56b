"""One module per stage's click command(s); bertkit/cli.py gathers them into the `bertkit` group."""
import math
import os

import click

from bertkit.embeddings import SEED as SEED_RANGE

# = bertkit.kernels.BACKENDS, spelled out so that `bertkit --help` needs no torch (tests/test_kernels_torch.py checks)
KERNEL_BACKENDS = ("auto", "triton", "torch", "reference")

report_to_option = click.option(
    "--report-to", default=None, show_default="tensorboard when installed",
    help="Where metrics go besides RUN/metrics.jsonl: tensorboard (RUN/tensorboard/), wandb (offline, RUN/wandb/; "
         "`wandb sync` uploads it), both as tensorboard,wandb, or none.")

kernels_option = click.option(
    "--kernels", type=click.Choice(KERNEL_BACKENDS), default="auto", show_default=True,
    help="Attention and LayerNorm: our Triton kernels, PyTorch's (SDPA, F.layer_norm), or the einsum reference "
         "(slow; the tests' ground truth). auto: on CUDA the Triton kernels are checked there and both backends "
         "timed at the run's shape, the faster runs (cached; a BERT encoder under --compile takes PyTorch's); "
         "PyTorch elsewhere.")


def default_workers() -> int:
    """Worker processes for the parallel stages: the CPUs this process may use, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus))


class Real(click.FloatRange):
    """A finite float within a range: click's FloatRange lets "nan" through (every comparison with nan is false)."""

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def count(minimum: int = 1) -> click.IntRange:
    """A whole number of things (steps, sequences, workers...): at least `minimum`."""
    return click.IntRange(min=minimum)


class RowsSource(click.ParamType):
    """A file of rows, or a 🤗 dataset: a save_to_disk folder, or hf:NAME:SPLIT (bertkit.hf_rows)."""
    name = "FILE|DATASET"

    def convert(self, value, param, ctx):
        from pathlib import Path

        text = str(value)
        if text.startswith("hf:") or Path(text).is_file():
            return text
        if Path(text).is_dir():
            from bertkit.hf_rows import is_dataset

            if is_dataset(text):
                return text
            self.fail(f"{text}: a folder, but not one 🤗 datasets' save_to_disk wrote (no state.json)", param, ctx)
        self.fail(f"{text}: no such file (or a save_to_disk folder, or hf:NAME:SPLIT)", param, ctx)


class Size(click.ParamType):
    """A number of bytes as 64MB, 512KB, 1GB or 100000, or one of `words` (kept as given)."""
    name = "size"

    def __init__(self, words: tuple = ()):
        self.words = words

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value in self.words:
            return value
        from bertkit.pipelines.prepare_corpus import parse_size

        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class NumberList(click.ParamType):
    """Comma-separated values, each checked by `each` (a click type), e.g. 1e-4,3e-4,1e-3; a tuple.

    Repeats are dropped (a sweep's rates) unless `unique=False` (masking shares: 0.1,0.1 means two shares)."""
    name = "list"

    def __init__(self, each: click.ParamType, unique: bool = True, example: str = "1e-4,3e-4,1e-3"):
        self.each, self.unique, self.example = each, unique, example

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = [x.strip() for x in str(value).split(",")]
        if not all(items):
            self.fail(f"{value!r}: values separated by commas, such as {self.example}", param, ctx)
        values = tuple(self.each.convert(x, param, ctx) for x in items)
        return tuple(dict.fromkeys(values)) if self.unique else values


SEED = click.IntRange(*SEED_RANGE)       # what numpy's, torch's and Python's generators all take
POSITIVE = Real(0, min_open=True)        # rates, weights, epochs
NON_NEGATIVE = Real(0)                   # decays, thresholds that 0 switches off
PROBABILITY = Real(0, 1)
