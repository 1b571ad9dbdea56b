"""`bertkit train-tokenizer`: placeholder until its issue lands."""
import click


@click.command("train-tokenizer", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
def train_tokenizer(args):
    """(not implemented yet)"""
    raise click.ClickException("train-tokenizer is not implemented yet")
