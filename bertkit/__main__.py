"""`python -m bertkit` is the `bertkit` command. Under the DeepSpeed launcher it runs from any folder, with no clone:
`deepspeed --num_gpus 2 --module bertkit pretrain ...` (the clone's `deepspeed cli.py pretrain ...` does the same)."""
from bertkit.cli import entry, strip_launcher_args

strip_launcher_args()
entry()
