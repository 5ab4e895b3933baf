"""``hpckit run``: a script's ranks started and restarted by the command, each attempt resuming
from the manifest."""

from __future__ import annotations

import sys
import uuid

from hpckit import settings as _settings
from hpckit.experiment.hangs import HUNG
from hpckit.launch.forwarding import EXIT_TERMINATED
from hpckit.launch.process import run_process, started_for
from hpckit.launch.steps import steps_for
from hpckit.logs import log
from hpckit.run.ending import stop
from hpckit.run.ending.exit import EXIT_TAKEN
from hpckit.run.ending.hang import EXIT_HUNG
from hpckit.run.ending.retry import RetryPolicy
from hpckit.run.ending.stop import EXIT_INTERRUPTED, EXIT_STOPPED
from hpckit.settings import variable
from hpckit.storage.uris import redact


def run_script(ranks: int, argv: list[str], policy: RetryPolicy, cwd: str | None = None,
               extra_env: dict[str, str] | None = None) -> int:
    """``hpckit run``: start ``ranks`` ranks of a script (under mpiexec, or across the Slurm
    allocation), restarting it after a failure as ``policy`` allows, on spare nodes where
    nodes were lost; each attempt resumes from the manifest. Returns the exit status: 0,
    EXIT_STOPPED, EXIT_TAKEN (another run took the experiment over: never restarted), or the
    last failure's."""
    settings = _settings.current()
    steps = steps_for(settings, ranks, [sys.executable, *argv])
    ids = {variable("run_id"): settings.run_id or f"run-{uuid.uuid4().hex}"}
    attempt = 0
    failed: dict[str, str] = {}
    seen: list[int] = []
    while True:
        launch = steps.launch()
        log.info("starting %d rank(s): %s", ranks, redact(" ".join(launch.command)))
        try:
            code = run_process(launch, {**(extra_env or {}), **ids, **failed,
                                         variable("attempt"): str(attempt),
                                         variable("restarts"): str(int(policy.allows(attempt))),
                                         variable("started_at"): started_for(attempt, settings)},
                               settings, cwd, seen)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED  # rank 0 said what was kept and how to resume
        if code in (0, EXIT_STOPPED, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_TAKEN) or \
                not policy.allows(attempt):
            return code
        attempt += 1
        if not steps.after_failure():
            log.error("%s", steps.no_spare(named=bool(settings.name)))
            return EXIT_STOPPED if stop.requeue(settings) else code
        failed = _failure_of(code, seen)
        log.warning("the ranks exited with status %d; restarting (%s)", code,
                    policy.describe(attempt))


def _failure_of(code: int, pids: list[int]) -> dict[str, str]:
    """What the next attempt records of this one, whose ranks ended with ``code``."""
    said = (HUNG if code == EXIT_HUNG else
            f"the ranks exited with status {code}; the failed rank's error is in the run's output")
    return {variable("previous_failure"): said, variable("previous_pids"): ",".join(map(str, pids)),
            variable("previous_hung"): str(int(code == EXIT_HUNG))}
