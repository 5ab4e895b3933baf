"""The ``hpckit`` command."""

from __future__ import annotations

import json

import click

import hpckit
from hpckit.errors import HpckitError
from hpckit.result import Result


@click.group()
@click.version_option(hpckit.__version__, prog_name="hpckit")
def main() -> None:
    """Batch training on HPC clusters: inspect and manage hpckit experiments."""


@main.command("ls")
@click.argument("experiment")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ls(experiment: str, as_json: bool) -> None:
    """List the committed checkpoints of EXPERIMENT (a path or URI).

    Example: hpckit ls ~/hpckit_results/resnet-fmnist
    """
    try:
        result = Result.from_path(experiment)
    except HpckitError as exc:
        raise click.UsageError(str(exc)) from None
    manifest = result._manifest
    assert manifest is not None
    latest = manifest.latest
    rows = [{"index": r.index, "directory": r.directory, "step": r.step,
             "bytes": r.size, "latest": r is latest, "metrics": r.metrics}
            for r in manifest.checkpoints]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for row in rows:
        mark = "*" if row["latest"] else " "
        click.echo(f"{mark} {row['directory']}  step {row['step']:>6}  {row['bytes']:>12} B  "
                   f"{json.dumps(row['metrics'])}")
