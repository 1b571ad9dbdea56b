"""`bertkit report`: flags onto bertkit.report.report."""
import click


@click.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="HTML file  [default: RUN_DIR/report.html].")
def report(run_dir, out):
    """One self-contained HTML page for a pretraining or fine-tuning run (loss and accuracy curves, training and
    held-out, the learning-rate schedule, throughput, the instances' statistics, the settings; a classifier's
    per-class scores and confusion matrix), or for a corpus (documents removed by reason, near-duplicate cluster
    sizes, personal data and evaluation text found)."""
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.report import report as run

    try:
        path = run(run_dir, out)
    except (FormatError, FolderError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {path}")
