"""``hpckit run``: a script's ranks started and restarted by the command, each attempt resuming
from the manifest."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator

from hpckit import exits
from hpckit import settings as _settings
from hpckit.experiment.artifacts import HUNG
from hpckit.launch import heartbeat
from hpckit.launch.process import run_process, started_for
from hpckit.launch.steps import (
    Next,
    Steps,
    after_failure,
    requeued_instead,
    steps_for,
    warn_of_idle_spares,
)
from hpckit.logs import log
from hpckit.run.ending.retry import RetryPolicy
from hpckit.settings import variable
from hpckit.storage.uris import redact


def run_script(ranks: int, argv: list[str], policy: RetryPolicy, cwd: str | None = None,
               extra_env: dict[str, str] | None = None) -> int:
    """``hpckit run``: start ``ranks`` ranks of a script (under mpiexec, or across the Slurm
    allocation), restarting it after a failure as ``policy`` allows, on spare nodes where
    nodes were lost (told by their heartbeats, as for ``python train.py``); each attempt
    resumes from the manifest. Returns the exit status: 0, exits.STOPPED, exits.TAKEN (another
    run took the experiment over: never restarted), or the last failure's."""
    settings = _settings.current()
    steps = steps_for(settings, ranks, [sys.executable, *argv])
    warn_of_idle_spares(steps, policy, "--max-failures")
    ids = {variable("run_id"): settings.run_id or f"run-{uuid.uuid4().hex}"}
    attempt = 0
    failed: dict[str, str] = {}
    seen: list[int] = []
    with _heartbeats(steps, cwd) as alive:
        while True:
            env = {**(extra_env or {}), **ids, **failed, variable("attempt"): str(attempt),
                   variable("restarts"): str(int(policy.allows(attempt))),
                   variable("started_at"): started_for(attempt, settings)}
            lost_before = steps.lost
            try:
                code = _attempt(steps, ranks, env, settings, cwd, seen, alive)
            except KeyboardInterrupt:
                return exits.INTERRUPTED  # rank 0 said what was kept and how to resume
            if not exits.restarts_after(code):
                return code
            following = after_failure(steps, policy, attempt)
            if following is Next.SPENT:
                return code
            attempt += 1
            if following is Next.NO_SPARE:
                said = steps.no_spare(named=bool(settings.name))
                return exits.STOPPED if requeued_instead(said, settings) else code
            failed = _failure_of(code, seen, steps.lost - lost_before)
            log.warning("the ranks exited with status %d; restarting (%s)", code,
                        policy.describe(attempt))


def _attempt(steps: Steps, ranks: int, env: dict[str, str], settings: _settings.Settings,
             cwd: str | None, seen: list[int], alive: str | None) -> int:
    """One start of the ranks; its exit status. A step that waits for a node whose
    heartbeat stopped and whose slurmd does not answer is given up and cancelled (status 1)."""
    launch = steps.launch()
    log.info("starting %d rank(s): %s", ranks, redact(" ".join(launch.command)))
    if alive is not None:
        shutil.rmtree(alive, ignore_errors=True)  # the last attempt's nodes beat no more
        os.makedirs(alive)
        env = {**env, variable("heartbeat"): alive}
    code = run_process(launch, env, settings, cwd, seen,
                       abandon=steps.watch(alive) if alive is not None else None)
    if code == exits.ABANDONED:
        steps.cancel()
        return 1
    return code


@contextlib.contextmanager
def _heartbeats(steps: Steps, cwd: str | None) -> Iterator[str | None]:
    """Across an allocation, a folder every node sees (in the working directory, as
    ``python train.py``'s launch folder is without shared storage) for the nodes' heartbeats;
    None on one node."""
    if steps.allocation is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix=".hpckit-run-", dir=cwd or os.getcwd())
    try:
        yield os.path.join(folder, heartbeat.FOLDER)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _failure_of(code: int, pids: list[int], lost: frozenset[str]) -> dict[str, str]:
    """What the next attempt records of this one, whose ranks ended with ``code``, where the
    nodes ``lost`` by then were left out."""
    said = (HUNG if code == exits.HUNG else
            f"node(s) {','.join(sorted(lost))} lost, with their ranks" if lost else
            f"the ranks exited with status {code}; the failed rank's error is in the run's output")
    return {variable("previous_failure"): said, variable("previous_pids"): ",".join(map(str, pids)),
            variable("previous_hung"): str(int(code == exits.HUNG))}
