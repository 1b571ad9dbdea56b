"""`bertkit make-instances`: placeholder until its issue lands."""
import click


@click.command("make-instances", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
def make_instances(args):
    """(not implemented yet)"""
    raise click.ClickException("make-instances is not implemented yet")
