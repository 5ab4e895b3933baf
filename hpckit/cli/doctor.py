"""``hpckit doctor``: check this site's set-up before submitting a job."""

from __future__ import annotations

import sys

import click

from hpckit import settings as _settings
from hpckit.cli.app import main
from hpckit.cli.tables import echo_json, echo_table
from hpckit.run.mpi.library import srun_plugin


@main.command()
@click.option("--storage", "storage_path", default=None,
              help="The storage path to check (default: HPCKIT_STORAGE, else ~/hpckit_results).")
@click.option("--cache-dir", default=None,
              help="A node-local cache directory to check (CheckpointConfig(cache_dir)).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--srun-mpi", is_flag=True,
              help="Print only the srun --mpi= plugin for the MPI that mpi4py loads (pmi2, "
                   "pmix), for job scripts: srun --mpi=$(python -m hpckit doctor --srun-mpi).")
def doctor(storage_path: str | None, cache_dir: str | None, as_json: bool,
           srun_mpi: bool) -> None:
    """Check this site's set-up, each finding with its fix: the MPI that mpi4py loaded and
    the launcher found, how the ranks were launched and placed, the torch build, the time
    `import torch` takes and the GPUs each rank sees, the storage path (writable, the same
    directory on every node), a node-local cache directory, and the Slurm job's signal and
    requeue settings. Run it alone on a login node, inside salloc, under mpiexec, or as
    `srun hpckit doctor`; rank 0 prints. Exits 1 when a check fails.

    Example: srun -N 2 --ntasks-per-node=4 --mpi=pmi2 hpckit doctor --storage /lustre/me/runs
    """
    if srun_mpi:
        click.echo(srun_plugin())
        return
    from mpi4py import MPI

    from hpckit.doctor import OK, checkup

    found, status = checkup(MPI.COMM_WORLD, _settings.refresh(), storage_path, cache_dir)
    if found is not None and as_json:
        echo_json([f.to_json() for f in found])
    elif found is not None:
        rows = []
        for f in found:
            rows.append([f.check, f.status, f.found])
            if f.fix and f.status != OK:
                rows.append(["", "", f"fix: {f.fix}"])
        echo_table(["CHECK", "STATUS", "FOUND"], rows)
    sys.exit(status)
