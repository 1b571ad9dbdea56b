"""`bertkit finetune`: placeholder until its issue lands."""
import click


@click.group("finetune")
def finetune():
    """(not implemented yet)"""
