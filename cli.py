"""Entry for the DeepSpeed launcher from a clone: `deepspeed cli.py pretrain ...` runs the `bertkit` click group.
From any folder: `deepspeed --module bertkit pretrain ...` (bertkit/__main__.py)."""
from bertkit.cli import entry, strip_launcher_args

strip_launcher_args()

if __name__ == "__main__":
    entry()
