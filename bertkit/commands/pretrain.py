"""`bertkit pretrain` and `bertkit export`: placeholders until their issue lands."""
import click


@click.command("pretrain", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
def pretrain(args):
    """(not implemented yet)"""
    raise click.ClickException("pretrain is not implemented yet")


@click.command("export", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
def export(args):
    """(not implemented yet)"""
    raise click.ClickException("export is not implemented yet")
