"""`bertkit verify`: bertkit.verify.verify_folder on each folder given."""
import sys

import click


@click.command("verify")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False))
def verify(folders):
    """Check every file of bertkit folders (corpus, tokenizer, instances, export, pretraining run) against the sizes
    and checksums recorded when they were written. Exit status 1 naming each damaged file.

    \b
    Example: bertkit verify corpus/ tokenizer/ instances/ runs/pretrain/
    """
    from bertkit.formats import FormatError
    from bertkit.verify import verify_folder

    bad = False
    for folder in folders:
        try:
            v = verify_folder(folder)
        except FormatError as e:
            click.echo(f"error: {e}", err=True)
            bad = True
            continue
        for note in v.notes:
            click.echo(f"note: {note}")
        for damage in v.damaged:
            click.echo(f"DAMAGED {damage}")
        status = "ok" if v.ok else f"{len(v.damaged)} damaged"
        click.echo(f"{folder} ({v.kind}): {v.checked} file(s) checked, {status}")
        bad = bad or not v.ok
    sys.exit(1 if bad else 0)
