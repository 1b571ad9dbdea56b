"""`bertkit prepare-corpus`: placeholder until its issue lands."""
import click


@click.command("prepare-corpus", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
def prepare_corpus(args):
    """(not implemented yet)"""
    raise click.ClickException("prepare-corpus is not implemented yet")
