"""A sweep under ``python sweep.py`` in a Slurm allocation (a batch script, ``salloc``): each
trial a job step of its own across the allocation's nodes (:mod:`hpckit.sweep.places`), at
most ``max_concurrent_trials`` at once, started by this process, which is the only writer of
``sweep.json``. A trial's ranks are an MPI world of their own, so a rank or a node that dies
costs only its trial: the trial starts again on the nodes left, from its own last committed
checkpoint, as its ``FailureConfig(max_failures)`` allows, while the others go on.

A lost node is told as for one run (:mod:`hpckit.launch.steps`): the first rank of each
node beats into the sweep's folder, and a node that went silent is asked through its
slurmd. The ranks' entry point is :mod:`hpckit.sweep.worker`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from hpckit import exits, uncaught
from hpckit.errors import LaunchError
from hpckit.experiment.experiment import end_abandoned_attempt
from hpckit.launch import heartbeat, lost
from hpckit.launch.allocation import Allocation, srun_command
from hpckit.launch.process import started_for
from hpckit.launch.steps import requeued_instead
from hpckit.logs import log
from hpckit.processes import ended_with
from hpckit.run.ending.exit import INTERRUPT_GRACE
from hpckit.run.ending.retry import RetryPolicy
from hpckit.run.ending.stop import ignored
from hpckit.run.job import write_payload
from hpckit.run.mpi.library import srun_plugin
from hpckit.settings import Settings, variable
from hpckit.storage.location import Location
from hpckit.sweep.places import Places
from hpckit.sweep.record import ERROR, PENDING, RUNNING, SweepManifest, SweepRecord, Trial
from hpckit.sweep.spawned import TUNER

POLL_S = 0.2
STOP_MARGIN_S = 5.0


@dataclass
class Step:
    """A trial's job step in flight."""

    trial: int
    nodes: tuple[str, ...]
    process: subprocess.Popen[bytes]
    name: str
    lost: frozenset[str] = frozenset()


def outcome_path(payload: str, index: int) -> str:
    return os.path.join(payload, f"trial-{index}.json")


def write_outcome(payload: str, trial: Trial) -> None:
    """On the trial's rank 0: how the trial ended, for the process that started its step."""
    path = outcome_path(payload, trial.index)
    with open(path + ".part", "w") as f:
        json.dump(trial.__dict__, f)
    os.replace(path + ".part", path)


def _read_outcome(payload: str, index: int) -> Trial | None:
    try:
        with open(outcome_path(payload, index)) as f:
            return Trial(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def run_allocated(tuner: Any, manifest: SweepManifest, todo: list[int],
                  writer: SweepRecord | None, location: Location, allocation: Allocation,
                  settings: Settings) -> SweepManifest:
    """Run the trials ``todo`` as job steps across ``allocation``; the sweep as they ended."""
    from hpckit.sweep.trials import ranks_per_trial

    places = Places(allocation, ranks_per_trial(tuner.trainable))
    if not places.capacity():
        raise LaunchError(
            f"a trial needs {places.per_trial} rank(s), and Slurm job {allocation.job_id} "
            f"has {len(allocation.nodes)} node(s) of {allocation.tasks_per_node} task(s): "
            "ask for more nodes or tasks per node, or give each trial fewer ranks.")
    shared = location.parent.path if location.is_local else os.getcwd()
    payload = tempfile.mkdtemp(prefix=".hpckit-sweep-", dir=shared)
    try:
        write_payload(payload, tuner, TUNER, "the Tuner",
                      "define the training function at module level (not a lambda or a "
                      "nested function) and keep param_space picklable")
        os.makedirs(os.path.join(payload, heartbeat.FOLDER))
        sweep = AllocatedSweep(places, payload, manifest, writer, location, settings,
                               RetryPolicy(tuner.run_config.failure_config.max_failures),
                               tuner.tune_config.max_concurrent_trials)
        return sweep.run(todo)
    finally:
        shutil.rmtree(payload, ignore_errors=True)


class AllocatedSweep:
    """The trials' steps, started, watched and started again; the sweep manifest kept."""

    def __init__(self, places: Places, payload: str, manifest: SweepManifest,
                 writer: SweepRecord | None, location: Location, settings: Settings,
                 policy: RetryPolicy, max_concurrent: int | None) -> None:
        self.places, self.payload, self.manifest = places, payload, manifest
        self.writer, self.location, self.settings = writer, location, settings
        self.policy, self.max_concurrent = policy, max_concurrent
        self.queue: deque[int] = deque()
        self.running: dict[int, Step] = {}
        self.failures: Counter[int] = Counter()
        self.stopping = False
        self.stopped = False
        self._asked: dict[str, float] = {}
        self._mpi = srun_plugin()

    @property
    def alive_folder(self) -> str:
        return os.path.join(self.payload, heartbeat.FOLDER)

    def run(self, todo: list[int]) -> SweepManifest:
        self.queue.extend(todo)
        log.info("trials run as job steps across the %d node(s) of Slurm job %s, up to %d "
                 "at once", len(self.places.alive), self.places.allocation.job_id,
                 self._limit())
        with self._forwarding():
            try:
                while self.running or (self.queue and not self.stopping):
                    self._start_what_fits()
                    self._collect_ended()
                    self._leave_out_lost()
                    time.sleep(POLL_S)
            except KeyboardInterrupt:
                self._interrupt()
                raise
        if self.stopped:
            raise SystemExit(exits.STOPPED)
        return self.manifest

    def _limit(self) -> int:
        return min(self.max_concurrent or self.places.capacity(), self.places.capacity())

    def _start_what_fits(self) -> None:
        while self.queue and not self.stopping and len(self.running) < self._limit():
            nodes = self.places.take()
            if nodes is None:
                return
            self._start(self.queue.popleft(), nodes)
        if self.queue and not self.running and not self.places.capacity():
            self._no_node_left()

    def _start(self, index: int, nodes: tuple[str, ...]) -> None:
        trial = self.manifest.trials[index]
        name = f"hpckit-trial-{index}-{uuid.uuid4().hex[:8]}"
        for node in nodes:  # silent until this step's rank beats, not stale
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.alive_folder, node))
        command = srun_command(self.places.allocation, nodes, self.places.per_trial, self._mpi,
                               name, [sys.executable, "-m", "hpckit.sweep.worker"],
                               overlap=bool(self.places.lost))
        env = {**os.environ, variable("sweep_payload"): self.payload,
               variable("sweep_trial"): str(index), variable("heartbeat"): self.alive_folder,
               variable("attempt"): str(self.failures[index]), variable("progress"): "0",
               variable("started_at"): started_for(self.failures[index], self.settings)}
        with ignored(self.settings.stop_signal):
            process = subprocess.Popen(command, env=env, start_new_session=True,
                                       preexec_fn=ended_with(os.getpid(), signal.SIGTERM))
        self.running[index] = Step(index, nodes, process, name)
        self._record(replace(trial, status=RUNNING, error=None))
        log.info("trial %s starts on %s", trial.dirname, ",".join(nodes))

    def _collect_ended(self) -> None:
        for index, step in list(self.running.items()):
            code = step.process.poll()
            if code is None:
                continue
            del self.running[index]
            self.places.release(step.nodes)
            outcome = _read_outcome(self.payload, index)
            if code == exits.OK and outcome is not None:
                self._record(outcome)
            elif code == exits.TAKEN:  # another run took the trial's experiment: kept so
                self._record(replace(self.manifest.trials[index], status=ERROR, error=(
                    "ExperimentTakenError: another run took the trial's experiment over")))
            elif not exits.restarts_after(code) or self.stopping:  # stopped, interrupted
                self.stopped = True
                self._record(replace(self.manifest.trials[index], status=PENDING))
            else:
                self._failed(step, code)

    def _failed(self, step: Step, code: int) -> None:
        """The step ended without the trial's outcome: its ranks failed, or its node was
        lost. Started again from its last committed checkpoint where its policy allows."""
        trial = self.manifest.trials[step.trial]
        why = (f"node(s) {','.join(sorted(step.lost))} lost, with their ranks" if step.lost
               else f"srun exited with status {code}; a rank failed or was killed")
        end_abandoned_attempt(self.location.join(trial.dirname), why)
        failed = self.failures[step.trial]
        if not self.policy.allows(failed):
            log.error("trial %s failed: %s", trial.dirname, why)
            self._record(replace(trial, status=ERROR, error=f"TrainingFailedError: {why}"))
            return
        self.failures[step.trial] += 1
        self.queue.appendleft(step.trial)
        log.warning("trial %s failed on %s (%s); starting it again from its last committed "
                    "checkpoint (%s)", trial.dirname, ",".join(step.nodes), why,
                    self.policy.describe(failed + 1))

    def _leave_out_lost(self) -> None:
        """Nodes of running steps that stopped beating and whose slurmd does not answer:
        never offered again, and their steps given up on."""
        nodes = tuple({n for step in self.running.values() for n in step.nodes})
        now = time.monotonic()
        suspects = tuple(n for n in heartbeat.stale(self.alive_folder, nodes)
                         if now - self._asked.get(n, -heartbeat.STALE_S) >= heartbeat.STALE_S)
        if not suspects:
            return
        self._asked.update(dict.fromkeys(suspects, now))
        found = lost.lost_nodes(suspects)
        if not found:
            return
        self.places.lose(found)
        log.warning("node(s) %s of Slurm job %s lost (their slurmd does not answer); their "
                    "trials start again on the other nodes", ",".join(sorted(found)),
                    self.places.allocation.job_id)
        for step in self.running.values():
            if found & set(step.nodes):
                step.lost = found & frozenset(step.nodes)
                step.process.kill()
                lost.cancel_step(self.places.allocation.job_id, step.name)

    def _no_node_left(self) -> None:
        allocation = self.places.allocation
        said = (f"node(s) {','.join(sorted(self.places.lost))} of Slurm job "
                f"{allocation.job_id} lost, and no node is left for the sweep's "
                f"{len(self.queue)} trial(s) to run. Finished trials and every trial's "
                "committed checkpoints are kept: requeue the job, or run the same command "
                "in a new one, and the sweep resumes.")
        if requeued_instead(said, self.settings):
            raise SystemExit(exits.STOPPED)
        raise uncaught.shown_elsewhere(LaunchError(said))

    def _record(self, trial: Trial) -> None:
        self.manifest = self.manifest.with_trial(trial)
        if self.writer is not None:
            self.writer.save(self.manifest)

    @contextlib.contextmanager
    def _forwarding(self) -> Iterator[None]:
        """The stop signal, SIGTERM and SIGHUP go to every step (srun passes them to its
        tasks, which stop after their next checkpoint); no trial starts after them."""
        def forward(signum: int, _frame: Any) -> None:
            self.stopping = True
            for step in self.running.values():
                with contextlib.suppress(OSError):
                    step.process.send_signal(signum)

        wanted = {signal.SIGTERM, signal.SIGHUP, self.settings.stop_signal}
        main = threading.current_thread() is threading.main_thread()  # else not ours to catch
        previous = {s: signal.signal(s, forward) for s in wanted} if main else {}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _interrupt(self) -> None:
        """Ctrl-C: passed to every step (twice within a second, as srun wants it); steps
        that have not ended once the ranks have recorded it are killed."""
        for step in self.running.values():
            for _ in range(2):
                with contextlib.suppress(OSError):
                    step.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_GRACE + STOP_MARGIN_S
        for step in self.running.values():
            try:
                step.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                step.process.kill()
                step.process.wait()
