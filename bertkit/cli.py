"""The `bertkit` command line: one click group, one sub-command per stage.

Each command lives in bertkit/commands/ and only maps flags onto a Python function;
heavy imports (torch, deepspeed) happen inside the commands so `bertkit --help` stays fast.
"""
import glob
import os
import sys

import click

from bertkit import __version__
from bertkit.commands.check_gpu import check_gpu
from bertkit.commands.corpus import prepare_corpus
from bertkit.commands.embed import embed, encode, evaluate_embeddings
from bertkit.commands.finetune import finetune
from bertkit.commands.instances import make_instances
from bertkit.commands.model import extend_vocab, fill_mask, merge, predict
from bertkit.commands.pretrain import export, pretrain
from bertkit.commands.report import report
from bertkit.commands.tokenizer import train_tokenizer
from bertkit.commands.verify import verify


def strip_launcher_args() -> None:
    """The DeepSpeed launcher appends --local_rank=N; torch.distributed reads LOCAL_RANK from the environment."""
    for arg in list(sys.argv[1:]):
        if arg.startswith("--local_rank"):
            sys.argv.remove(arg)
            if "=" in arg:
                os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])


def quiet_deepspeed_on_cpu() -> None:
    """DeepSpeed warns "Setting accelerator to CPU" in every process of a CPU run (five times in the demo). Where
    the machine has no GPU device at all, naming the CPU accelerator ourselves keeps it quiet; a machine with one
    is left to DeepSpeed's own detection."""
    if "DS_ACCELERATOR" not in os.environ and not glob.glob("/dev/nvidia[0-9]*") and not os.path.exists("/dev/kfd"):
        os.environ["DS_ACCELERATOR"] = "cpu"


quiet_deepspeed_on_cpu()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="bertkit")
def main():
    """Pretrain and fine-tune BERT-family encoders (BERT, ModernBERT) on your own corpus.

    Stages: prepare-corpus -> train-tokenizer -> make-instances -> pretrain -> export / fill-mask / finetune.
    """


for command in (prepare_corpus, train_tokenizer, make_instances, fill_mask, predict, pretrain, export, merge, finetune,
                report, verify, check_gpu, evaluate_embeddings, encode, extend_vocab):
    main.add_command(command)
finetune.add_command(embed)


def entry():
    """The console script: `main`, then, in a process that made a process group (pretrain, finetune under a
    launcher), an exit that skips the interpreter's C++ teardown (bertkit.distributed explains why)."""
    try:
        main()
    except SystemExit as e:  # click ends every command so, with the command's code
        # a process that never loaded bertkit.distributed made no group: `--help` and the data stages end without
        # importing torch (3 s of a 0.2 s `bertkit --help`)
        distributed = sys.modules.get("bertkit.distributed")
        if distributed is not None and distributed.made_group_here():
            distributed.exit_now(e.code if isinstance(e.code, int) else 0 if e.code is None else 1)
        raise


if __name__ == "__main__":
    entry()
