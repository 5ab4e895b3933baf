"""One trial's job step in a Slurm allocation, as :mod:`hpckit.sweep.allocated` starts it: the
``srun`` of the trial's ranks on its nodes, the file in which the trial's rank 0 says how it
ended, and the end of steps that must not outlive the sweep.

A step's ranks are an MPI world of their own, and they do not restart themselves: every
failure of a trial ends its step, and the process that started it counts it against the
trial's ``FailureConfig(max_failures)`` (one counter, as for ``python train.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from hpckit.errors import HpckitError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.reading import read_manifest
from hpckit.launch import heartbeat, lost
from hpckit.launch.allocation import Allocation, srun_command
from hpckit.processes import ended_with
from hpckit.run.ending.exit import INTERRUPT_GRACE
from hpckit.run.ending.stop import ignored
from hpckit.settings import Settings
from hpckit.storage.location import Location
from hpckit.sweep.record import Trial

STOP_MARGIN_S = 5.0  # after Ctrl-C, beyond the ranks' own grace: each trial records it
SILENT_START_S = 2 * heartbeat.STALE_S  # a step's node that has not beaten by then is asked


@dataclass
class Step:
    """A trial's job step in flight."""

    trial: int
    nodes: tuple[str, ...]
    process: subprocess.Popen[bytes]
    name: str
    started: float = field(default_factory=time.monotonic)
    lost: frozenset[str] = frozenset()


def start_step(allocation: Allocation, nodes: tuple[str, ...], trial: int, ranks: int,
               mpi: str, env: dict[str, str], settings: Settings, overlap: bool) -> Step:
    """``ranks`` ranks of the trial ``trial`` on ``nodes``, each with the CPUs it asks for
    alone (``--exact``), so that trials share a node up to its tasks."""
    name = f"hpckit-trial-{trial}-{uuid.uuid4().hex[:8]}"
    command = srun_command(allocation, nodes, ranks, mpi, name,
                           [sys.executable, "-m", "hpckit.sweep.worker"], overlap=overlap,
                           exact=True)
    with ignored(settings.stop_signal):  # srun passes it on to the ranks, which handle it
        process = subprocess.Popen(command, env={**os.environ, **env}, start_new_session=True,
                                   preexec_fn=ended_with(os.getpid(), signal.SIGTERM))
    return Step(trial, nodes, process, name)


def assignment_path(payload: str, index: int) -> str:
    """Where the sweep's process leaves a trial's assignment (its params, and the trial it
    exploits) for the trial's ranks."""
    return os.path.join(payload, f"trial-{index}.pkl")


def outcome_path(payload: str, index: int) -> str:
    return os.path.join(payload, f"trial-{index}.json")


def write_outcome(payload: str, trial: Trial) -> None:
    """On the trial's rank 0: how the trial ended, for the process that started its step."""
    path = outcome_path(payload, trial.index)
    with open(path + ".part", "w") as f:
        json.dump(trial.__dict__, f)
    os.replace(path + ".part", path)


def read_outcome(payload: str, index: int) -> Trial | None:
    try:
        with open(outcome_path(payload, index)) as f:
            return Trial(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def suspect_nodes(steps: Iterable[Step], folder: str, asked: dict[str, float]) -> tuple[str, ...]:
    """The nodes of running ``steps`` to ask through their slurmd: those that stopped beating
    into ``folder``, and those a step started on :data:`SILENT_START_S` ago that never beat;
    a node is asked at most once every ``heartbeat.STALE_S`` (``asked`` keeps when)."""
    now = time.monotonic()
    steps = list(steps)
    silent = {n for step in steps if now - step.started > SILENT_START_S
              for n in step.nodes if not os.path.exists(os.path.join(folder, n))}
    nodes = tuple({n for step in steps for n in step.nodes})
    found = tuple(n for n in {*heartbeat.stale(folder, nodes), *silent}
                  if now - asked.get(n, -heartbeat.STALE_S) >= heartbeat.STALE_S)
    asked.update(dict.fromkeys(found, now))
    return found


def failure_of(step: Step, code: int, experiment: Location) -> str:
    """Why the step ended without the trial's outcome, in one line: its lost nodes, else the
    failure its own manifest recorded, else srun's status."""
    if step.lost:
        return f"node(s) {','.join(sorted(step.lost))} lost, with their ranks"
    with contextlib.suppress(HpckitError):
        manifest = read_manifest(experiment)
        last = manifest.last_attempt if manifest else None
        if last is not None and last.status is AttemptStatus.FAILED and last.error:
            return last.error.splitlines()[0]
    return f"srun exited with status {code}; a rank failed or was killed"


def kill(step: Step, job_id: str) -> None:
    """SIGKILL the step's srun and, through Slurm, its tasks on every node it can reach."""
    with contextlib.suppress(OSError):
        step.process.kill()
    lost.cancel_step(job_id, step.name)


def end_steps(steps: Iterable[Step], job_id: str) -> None:
    """The sweep ends here (Ctrl-C, or an error of its own): SIGINT to every step (twice
    within a second, as srun wants it), so that each trial records how it ended; those that
    have not ended by then are killed, tasks and all."""
    steps = [s for s in steps if s.process.poll() is None]
    for step in steps:
        for _ in range(2):
            with contextlib.suppress(OSError):
                step.process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + INTERRUPT_GRACE + STOP_MARGIN_S
    for step in steps:
        try:
            step.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill(step, job_id)
            step.process.wait()
