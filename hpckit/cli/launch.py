"""Commands that start ranks: run, resume, and sweep (a job array of a Tune sweep)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from typing import NoReturn

import click

from hpckit import settings
from hpckit.cli.app import main
from hpckit.cli.common import require
from hpckit.errors import LaunchError
from hpckit.experiment.manifest import Manifest
from hpckit.experiment.opening import resize_refusal
from hpckit.experiment.reading import read_manifest
from hpckit.launch import allocation
from hpckit.launch.script import run_script
from hpckit.launch.slurm import Layout, render_array_job, render_resume_job
from hpckit.run.ending.retry import RetryPolicy
from hpckit.run.job import RESUMED_SWEEP
from hpckit.run.mpi.library import srun_plugin
from hpckit.settings import variable
from hpckit.storage.location import Location, resolve
from hpckit.storage.uris import parent, redact, restore_credentials
from hpckit.sweep.record import SweepManifest, SweepRecord


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-n", "--ranks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of ranks to start (on this node; in a Slurm allocation, across it).")
@click.option("--max-failures", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Restarts after a failure (-1: no limit); each resumes from the manifest.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(ranks: int, max_failures: int, script: str, args: tuple[str, ...]) -> None:
    """Start SCRIPT on N ranks, restarting it after failures: on this node with mpiexec, or
    in a Slurm allocation with srun across its nodes (spares replace nodes that failed).

    Example: hpckit run -n 4 --max-failures 3 train.py --epochs 10
    """
    sys.exit(run_script(ranks, [script, *args], RetryPolicy(max_failures)))


@main.command()
@click.argument("experiment")
@click.option("-n", "--ranks", type=click.IntRange(min=1), default=None,
              help="World size (default: the recorded one; changing it needs checkpoints of "
                   "rank 0's files or DCP's). Ranks set aside to validate are started beside it.")
@click.option("--max-failures", type=click.IntRange(min=-1), default=None,
              help="Restarts after a failure (-1: no limit; default: the recorded "
                   "FailureConfig(max_failures), else 0).")
@click.option("--sbatch", "sbatch_file", type=click.Path(dir_okay=False), default=None,
              help="Write an sbatch script to FILE and submit it instead of running here.")
@click.option("--time", "time_limit", default=None, metavar="TIME",
              help="With --sbatch: the job's time limit, as sbatch takes it (e.g. 02:00:00).")
@click.option("--slurm", "directives", multiple=True, metavar="KEY=VALUE",
              help="With --sbatch: another #SBATCH option, e.g. --slurm partition=gpu "
                   "--slurm gpus-per-task=1 (repeatable).")
@click.option("--dry-run", is_flag=True,
              help="With --sbatch: print the job script instead of writing and submitting it.")
def resume(experiment: str, ranks: int | None, max_failures: int | None, sbatch_file: str | None,
           time_limit: str | None, directives: tuple[str, ...], dry_run: bool) -> None:
    """Continue EXPERIMENT with the command, arguments and world size in its manifest.

    EXPERIMENT may be a sweep's directory: the command that started the sweep runs again,
    as it was started, and continues the same search.

    Example: hpckit resume /lustre/me/runs/resnet --sbatch resume-resnet.sbatch --time 04:00:00
    --slurm partition=gpu --slurm gpus-per-task=1
    """
    options = _sbatch_options(time_limit, directives)
    if (options or dry_run) and not sbatch_file:
        raise click.UsageError("--time, --slurm and --dry-run are options of the job script: "
                               "add --sbatch FILE, or leave them out to resume here.")
    sweep = _sweep_at(experiment)
    if sweep is not None:
        _resume_sweep(experiment, *sweep, ranks=ranks, max_failures=max_failures,
                      sbatch_file=sbatch_file)
    location, manifest = require(experiment)
    if max_failures is None:
        max_failures = int((manifest.config.get("failure_config") or {}).get("max_failures") or 0)
    world = _world_size(manifest, ranks)
    launched = world + int(manifest.config.get("validation_ranks") or 0)
    command = manifest.command
    argv = [restore_credentials(a, experiment) for a in command.get("argv") or []]
    cwd = command.get("cwd") or os.getcwd()
    if not argv:
        raise click.UsageError(f"the manifest of {location.display} records no command to resume.")
    _check_resumable(location.display, argv, cwd)
    # The root as the user gave it (credentials included), never the redacted display form.
    root, _ = parent(experiment)
    env = {variable("name"): manifest.experiment, variable("storage"): root,
           variable("resume"): str(manifest.config.get("train_loop") or "*"),
           **({variable("resume_workers"): str(world)} if ranks else {})}
    if sbatch_file:
        again = [*(["-n", str(ranks)] if ranks else []), "--max-failures", str(max_failures)]
        text = render_resume_job(
            experiment if "://" in experiment else os.path.abspath(experiment),
            _layout(manifest, launched, world), again, cwd, manifest.experiment,
            command.get("executable") or sys.executable, options)
        if dry_run:
            click.echo(text, nl=False)
        else:
            _submit(sbatch_file, text)
        return
    _warn_outside_an_allocation(manifest, launched)
    aside = f" and {launched - world} set aside to validate" if launched > world else ""
    click.echo(f"resuming {location.display} with {world} rank(s){aside}: "
               f"{redact(' '.join(argv))}", err=True)
    sys.exit(run_script(launched, argv, RetryPolicy(max_failures), cwd=cwd, extra_env=env))


def _sweep_at(path: str) -> tuple[Location, SweepManifest] | None:
    """The sweep at ``path`` (a directory with sweep.json and no manifest.json), if it is one."""
    location = resolve(path)
    if read_manifest(location) is not None:
        return None
    sweep = SweepRecord(location).load()
    return None if sweep is None else (location, sweep)


def _resume_sweep(path: str, location: Location, sweep: SweepManifest, *, ranks: int | None,
                  max_failures: int | None, sbatch_file: str | None) -> NoReturn:
    """Run again the command that started the sweep at ``path``, as it was started: it
    continues the same search (finished trials kept, interrupted ones resumed)."""
    shown = location.display
    if ranks is not None or max_failures is not None:
        raise click.UsageError(
            f"{shown} is a sweep: each trial's ranks and restarts are its trainer's "
            "(ScalingConfig, FailureConfig in the script); resume it without -n and "
            "--max-failures.")
    command = sweep.command
    if not command or not command.get("argv"):
        raise click.UsageError(
            f"{shown} is a sweep whose sweep.json records no command (an earlier hpckit "
            "planned it); run its script again with the same RunConfig(name=...): it resumes.")
    if command.get("array"):
        raise click.UsageError(
            f"{shown} is the sweep of a Slurm job array: submit the array job again "
            "(hpckit sweep --array N ...); its finished tasks return at once "
            "(docs/slurm-sweeps.md).")
    if sbatch_file:
        raise click.UsageError(
            f"{shown} is a sweep: its job script is the one that started it; submit that "
            "again (sbatch FILE), or resume here inside an allocation (salloc, then hpckit "
            "resume).")
    argv = [restore_credentials(a, path) for a in command["argv"]]
    cwd = command.get("cwd") or os.getcwd()
    _check_resumable(shown, argv, cwd)
    root, _ = parent(path)
    env = {variable("name"): sweep.name, variable("storage"): root,
           variable("resume"): RESUMED_SWEEP}
    world = int(command.get("ranks") or 1)
    click.echo(f"resuming sweep {shown}: {redact(' '.join(argv))}", err=True)
    if world > 1 or command.get("launcher", "python") != "python":  # its trials packed on ranks
        sys.exit(run_script(world, argv, RetryPolicy(0), cwd=cwd, extra_env=env))
    driver = subprocess.Popen([command.get("executable") or sys.executable, *argv], cwd=cwd,
                              env={**os.environ, **env})
    while True:
        try:
            sys.exit(driver.wait())
        except KeyboardInterrupt:  # the driver heard it too, and stops its trials
            continue


def _layout(manifest: Manifest, launched: int, world: int) -> Layout:
    """The last allocation's shape (its spares included) where the world size is the same;
    else ``--ntasks``."""
    last = manifest.last_attempt
    if last is None or not last.slurm.get("nodelist") or world != manifest.world_size:
        return Layout(launched)
    nodelist = last.slurm["nodelist"]
    try:
        nodes = len(allocation.hostnames(nodelist))
    except LaunchError:
        return Layout(launched)
    return Layout.of(launched, last.slurm.get("tasks_per_node"), nodes)


def _check_resumable(experiment: str, argv: list[str], cwd: str) -> None:
    """What the recorded command cannot do again, said before anything starts."""
    if argv[0] == "-c":
        raise click.UsageError(
            f"{experiment} was started with python -c, whose code Python does not keep; run "
            "that code again with RunConfig(name=...) naming this experiment, and it resumes.")
    if not os.path.isdir(cwd):
        raise click.UsageError(
            f"{experiment} was started in {cwd}, which no longer exists; create it again "
            f"with what the command needs, or run from where your script now lies: "
            f"{redact(' '.join(argv))}")


def _warn_outside_an_allocation(manifest: Manifest, launched: int) -> None:
    """Resuming here starts every rank on this node: on a login node, a world larger than
    its CPUs, or one that srun spread over nodes, belongs in an allocation."""
    if allocation.current(settings.current()) is not None:
        return
    cpus = len(os.sched_getaffinity(0))
    last = manifest.last_attempt
    under_srun = last is not None and last.launcher == "srun"
    if launched > cpus or under_srun:
        why = "its last attempt ran under srun" if under_srun else f"this node has {cpus} CPU(s)"
        click.echo(f"warning: starting all {launched} rank(s) on this node "
                   f"({socket.gethostname()}), outside any Slurm allocation, and {why}. On a "
                   "cluster, resume inside an allocation (salloc, then hpckit resume) or as a "
                   "job (hpckit resume --sbatch FILE).", err=True)


def _world_size(manifest: Manifest, ranks: int | None) -> int:
    recorded = manifest.world_size
    if ranks is None:
        return recorded
    refused = resize_refusal(manifest.latest, recorded, ranks)
    if refused:
        raise click.UsageError(refused)
    return ranks


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--array", "tasks", type=click.IntRange(min=1), required=True,
              help="Array tasks that share the trials (trial index modulo TASKS).")
@click.option("--ntasks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ranks per array task: a multiple of one trial's ranks.")
@click.option("--time", "time_limit", default=None, metavar="TIME",
              help="Time limit of each task, as sbatch takes it (e.g. 02:00:00).")
@click.option("--slurm", "directives", multiple=True, metavar="KEY=VALUE",
              help="Another #SBATCH option, e.g. --slurm partition=gpu (repeatable).")
@click.option("--sbatch", "sbatch_file", type=click.Path(dir_okay=False), default=None,
              help="Where to write the job script [default: SCRIPT's name + .sbatch].")
@click.option("--dry-run", is_flag=True, help="Print the job script instead of submitting it.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sweep(tasks: int, ntasks: int, time_limit: str | None, directives: tuple[str, ...],
          sbatch_file: str | None, dry_run: bool, script: str, args: tuple[str, ...]) -> None:
    """Submit SCRIPT, a Tune sweep (tune.Tuner(...).fit()), as a Slurm job array.

    Each task runs SCRIPT on its ranks; its Tuner runs that task's share of the trials, packed
    onto its ranks. Submitting again resumes the sweep.

    Example: hpckit sweep --array 4 --ntasks 2 --time 02:00:00 sweep.py --epochs 10
    """
    name = os.path.splitext(os.path.basename(script))[0]
    text = render_array_job([os.path.abspath(script), *args], ntasks, os.getcwd(), name,
                            sys.executable, tasks, _sbatch_options(time_limit, directives),
                            _srun_mpi(sys.executable))
    if dry_run:
        click.echo(text, nl=False)
        return
    _submit(sbatch_file or f"{name}.sbatch", text)


def _sbatch_options(time_limit: str | None, directives: tuple[str, ...]) -> tuple[str, ...]:
    """``--time`` and ``--slurm KEY=VALUE`` options as ``#SBATCH`` options."""
    options = [f"--time={time_limit}"] if time_limit else []
    for directive in directives:
        key, equals, value = directive.partition("=")
        if not key or not equals or key.startswith("-"):
            raise click.BadParameter(f"{directive!r}: give KEY=VALUE, e.g. partition=gpu",
                                     param_hint="--slurm")
        options.append(f"--{key}={value}")
    return tuple(options)


def _srun_mpi(python: str) -> str:
    """The ``srun --mpi=`` plugin for the MPI that mpi4py loads under ``python``; the job's
    ranks run that interpreter, so it is asked, not this one."""
    return srun_plugin(python=python if os.path.exists(python) else None)


def _submit(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise click.ClickException(f"cannot write the job script {path}: {exc.strerror}; give "
                                   "--sbatch a file in a directory you can write") from None
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise click.ClickException(f"wrote {path}, but sbatch is not on PATH; submit it on a "
                                   "login node with: sbatch " + path)
    out = subprocess.run([sbatch, "--parsable", path], capture_output=True, text=True)
    if out.returncode != 0:
        raise click.ClickException(f"sbatch {path} failed: {out.stderr.strip()}")
    click.echo(f"submitted job {out.stdout.strip().split(';')[0]} ({path})")
