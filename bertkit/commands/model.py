"""`bertkit fill-mask`: placeholder until its issue lands."""
import click


@click.command("fill-mask", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
def fill_mask(args):
    """(not implemented yet)"""
    raise click.ClickException("fill-mask is not implemented yet")
