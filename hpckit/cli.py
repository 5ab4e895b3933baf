"""The ``hpckit`` command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import click

import hpckit
from hpckit import _experiment, _launch, _slurm
from hpckit._manifest import Manifest
from hpckit._uri import Location, parent, redact, resolve, restore_credentials
from hpckit.errors import HpckitError
from hpckit.result import Result


@click.group()
@click.version_option(hpckit.__version__, prog_name="hpckit")
def main() -> None:
    """Batch training on HPC clusters: run, resume and inspect hpckit experiments."""
    from hpckit import _log

    _log.configure(0)


def _open(experiment: str) -> tuple[Location, Manifest]:
    try:
        location = resolve(experiment)
        manifest = _experiment.read_manifest(location)
    except HpckitError as exc:
        raise click.UsageError(str(exc)) from None
    if manifest is None:
        raise click.UsageError(f"{location.display} has no manifest.json: it is not an hpckit "
                               "experiment directory (pass {storage_path}/{name}).")
    return location, manifest


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


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-n", "--ranks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of ranks to start on this node.")
@click.option("--max-failures", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Restarts after a failure (-1: no limit); each resumes from the manifest.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(ranks: int, max_failures: int, script: str, args: tuple[str, ...]) -> None:
    """Start SCRIPT on N ranks of this node with mpiexec, restarting it after failures.

    Example: hpckit run -n 4 --max-failures 3 train.py --epochs 10
    """
    try:
        code = _launch.run_script(ranks, [script, *args], max_failures)
    except HpckitError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


@main.command()
@click.argument("experiment")
@click.option("-n", "--ranks", type=click.IntRange(min=1), default=None,
              help="World size (default: the recorded one; changing it needs rank-0-only checkpoints).")
@click.option("--max-failures", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Restarts after a failure (-1: no limit).")
@click.option("--sbatch", "sbatch_file", type=click.Path(dir_okay=False), default=None,
              help="Write an sbatch script to FILE and submit it instead of running here.")
def resume(experiment: str, ranks: int | None, max_failures: int, sbatch_file: str | None) -> None:
    """Continue EXPERIMENT with the command, arguments and world size in its manifest.

    Example: hpckit resume /lustre/me/runs/resnet --sbatch resume-resnet.sbatch
    """
    location, manifest = _open(experiment)
    world = _world_size(manifest, ranks)
    command = manifest.command
    argv = [restore_credentials(a, experiment) for a in command.get("argv") or []]
    cwd = command.get("cwd") or os.getcwd()
    if not argv:
        raise click.UsageError(f"the manifest of {location.display} records no command to resume.")
    # The root as the user gave it (credentials included), never the redacted display form.
    root, _ = parent(experiment)
    env = {"HPCKIT_NAME": manifest.experiment, "HPCKIT_STORAGE": root}
    if sbatch_file:
        _submit(sbatch_file, argv, world, cwd, manifest.experiment,
                command.get("executable") or sys.executable, env)
        return
    click.echo(f"resuming {location.display} with {world} rank(s): {redact(' '.join(argv))}",
               err=True)
    try:
        code = _launch.run_script(world, argv, max_failures, cwd=cwd, extra_env=env)
    except HpckitError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


def _world_size(manifest: Manifest, ranks: int | None) -> int:
    recorded = manifest.world_size
    if ranks is None or ranks == recorded:
        return recorded
    latest = manifest.latest
    writers = sorted({f.rank for f in latest.files}) if latest else []
    if any(r != 0 for r in writers):
        raise click.UsageError(
            f"-n {ranks} differs from the recorded world size {recorded}, but "
            f"{latest.directory if latest else ''} holds files written by ranks {writers}: "
            f"per-rank shards need the same world size. Use -n {recorded}, or reshard by hand.")
    return ranks


def _submit(path: str, argv: list[str], world: int, cwd: str, name: str, python: str,
            env: dict[str, str]) -> None:
    text = _slurm.render_sbatch(argv, world, cwd, name, python, env)
    with open(path, "w") as f:
        f.write(text)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise click.ClickException(f"wrote {path}, but sbatch is not on PATH; submit it on a "
                                   "login node with: sbatch " + path)
    out = subprocess.run([sbatch, "--parsable", path], capture_output=True, text=True)
    if out.returncode != 0:
        raise click.ClickException(f"sbatch {path} failed: {out.stderr.strip()}")
    click.echo(f"submitted job {out.stdout.strip().split(';')[0]} ({path})")
