"""Entry for the DeepSpeed launcher: `deepspeed cli.py pretrain ...` runs the `bertkit` click group."""
import os
import sys

# The launcher appends --local_rank=N; torch.distributed reads LOCAL_RANK from the environment instead.
for arg in list(sys.argv[1:]):
    if arg.startswith("--local_rank"):
        sys.argv.remove(arg)
        if "=" in arg:
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])

from bertkit.cli import entry  # noqa: E402

if __name__ == "__main__":
    entry()
