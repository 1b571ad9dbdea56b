"""`bertkit check-gpu`: flags onto bertkit.check_gpu.CheckConfig."""
import sys

import click


@click.command("check-gpu")
@click.option("--device", default="cuda", show_default=True,
              help="cuda or cuda:N. (cpu checks the Triton interpreter when TRITON_INTERPRET=1 is set.)")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["bf16", "fp16", "fp32"]),
              help="Precisions to check (repeat the flag)  [default: bf16 and fp16].")
@click.option("--quick", is_flag=True, help="Only each kernel's default tile configuration, not every shipped one.")
@click.option("--no-timing", is_flag=True, help="Correctness only.")
@click.option("--small", is_flag=True, help="Tiny shapes (for the CPU interpreter and tests), not BERT's.")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="Write the JSON report to this file  [default: none; --json prints it].")
@click.option("--json", "as_json", is_flag=True,
              help="Print the JSON report (versions, device, every case) on stdout, to attach to a bug report as it "
                   "is; the progress lines go to stderr.")
def check_gpu(device, dtypes, quick, no_timing, small, out, as_json):
    """Check the Triton kernels on this GPU against float64 references and time them against PyTorch's SDPA and
    LayerNorm; prints a verdict and the --kernels to use. Exit status 1 when a kernel check fails.

    \b
    Example: bertkit check-gpu --quick      (90 s on an H100: each kernel's default tiles, 64 cases)
             bertkit check-gpu              (every shipped tile configuration: several minutes)
    """
    from bertkit.check_gpu import CheckConfig, check_gpu as run

    cfg = CheckConfig(device=device, dtypes=tuple(dtypes) or CheckConfig.dtypes, every_config=not quick,
                      timing=not no_timing, small=small, out=out)
    if small:
        cfg.hiddens = (128, 768)
    report = run(cfg, progress=lambda line: click.echo(line, err=as_json))
    if as_json:
        import json

        click.echo(json.dumps(report, indent=1))
    sys.exit(1 if report.get("failed") else 0)
