"""A sweep under ``python sweep.py`` in a Slurm allocation of several nodes (a batch script
that runs the script itself, or ``salloc``): each trial a job step of its own across the
allocation's nodes (:mod:`hpckit.sweep.trialsteps`), at most
``max_concurrent_trials`` at once, started by this process, which is the only writer of
``sweep.json``. A trial's ranks are an MPI world of their own, so a rank or a node that dies
costs only its trial: the trial starts again on the nodes left, from its own last committed
checkpoint, as its ``FailureConfig(max_failures)`` allows, while the others go on.

A lost node is told as for one run (:mod:`hpckit.launch.steps`): the first rank of each node
beats into the sweep's folder, and a node that went silent, never beat, or whose step failed
is asked through its slurmd; one that does not answer is never used again in the job.

Where a sweep's trials run in a Slurm allocation that ``python sweep.py`` runs in: each
trial a job step on a place of the allocation's nodes, spread over them. A trial of no more
ranks than Slurm gives a node shares a node with others (as many as its tasks hold); a
larger trial takes whole nodes. A lost node is never offered again; the places of its
trials go with it, and the trials start again elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, NoReturn

from hpckit import exits, uncaught
from hpckit.errors import LaunchError
from hpckit.experiment.experiment import end_abandoned_attempt
from hpckit.experiment.values import jsonable
from hpckit.launch import heartbeat, lost
from hpckit.launch.allocation import Allocation, current
from hpckit.launch.process import started_for
from hpckit.launch.steps import requeued_instead
from hpckit.logs import log
from hpckit.run.ending import stop
from hpckit.run.ending.retry import RetryPolicy
from hpckit.run.job import write_payload
from hpckit.run.mpi.library import srun_plugin
from hpckit.settings import Settings, variable
from hpckit.storage.location import Location
from hpckit.sweep.controller import Assignment, TuneController
from hpckit.sweep.decisions import answer_files
from hpckit.sweep.record import (
    ERROR,
    PENDING,
    TERMINATED,
    SweepManifest,
    Trial,
)
from hpckit.sweep.trialqueue import TUNER
from hpckit.sweep.trials import finished, ranks_per_trial
from hpckit.sweep.trialsteps import (
    Step,
    assignment_path,
    end_steps,
    failure_of,
    kill,
    read_outcome,
    start_step,
    suspect_nodes,
)

POLL_S = 0.2


def across_nodes(settings: Settings) -> Allocation | None:
    """The Slurm allocation of several nodes this process runs in, where trials are spread;
    None elsewhere (one node: the ranks start here, as outside Slurm)."""
    allocation = current(settings)
    return allocation if allocation is not None and len(allocation.nodes) > 1 else None


def run_allocated(tuner: Any, controller: TuneController, location: Location,
                  allocation: Allocation, settings: Settings) -> SweepManifest:
    """Run the trials the controller hands out as job steps across ``allocation``; the sweep
    as they ended. Their reports reach the controller through files in the sweep's folder
    (:class:`hpckit.sweep.decisions.Files`), which this process answers as it polls."""
    places = Places(allocation, ranks_per_trial(tuner.trainable))
    if not places.capacity():
        raise LaunchError(
            f"a trial needs {places.per_trial} rank(s), and Slurm job {allocation.job_id} "
            f"has {len(allocation.nodes)} node(s) of {allocation.tasks_per_node} task(s): "
            "ask for more nodes or tasks per node, or give each trial fewer ranks.")
    asked = tuner.tune_config.max_concurrent_trials
    if asked and asked > places.capacity():
        log.warning("TuneConfig(max_concurrent_trials=%d), but Slurm job %s holds %d trial(s) "
                    "of %d rank(s) at once: at most %d run together", asked, allocation.job_id,
                    places.capacity(), places.per_trial, places.capacity())
    shared = location.parent.path if location.is_local else os.getcwd()
    payload = tempfile.mkdtemp(prefix=".hpckit-sweep-", dir=shared)
    try:
        write_payload(payload, tuner, TUNER, "the Tuner",
                      "define the training function at module level (not a lambda or a "
                      "nested function) and keep param_space picklable")
        os.makedirs(os.path.join(payload, heartbeat.FOLDER))
        sweep = AllocatedSweep(places, payload, controller, location, settings,
                               RetryPolicy(tuner.run_config.failure_config.max_failures), asked)
        return sweep.run()
    finally:
        shutil.rmtree(payload, ignore_errors=True)


class AllocatedSweep:
    """The trials' steps, started, watched and started again; the sweep manifest kept."""

    def __init__(self, places: Places, payload: str, controller: TuneController,
                 location: Location, settings: Settings, policy: RetryPolicy,
                 max_concurrent: int | None) -> None:
        self.places, self.payload, self.controller = places, payload, controller
        self.location, self.settings = location, settings
        self.policy, self.max_concurrent = policy, max_concurrent
        self.queue: deque[Assignment] = deque()  # trials to start again after a failure
        self.assigned: dict[int, Assignment] = {}
        self.done = False  # the controller has nothing left to hand out
        self.running: dict[int, Step] = {}
        self.failures: Counter[int] = Counter()
        self.stopping = False  # a stop reached the sweep: no trial starts any more
        self.stopped: list[int] = []  # trials whose steps stopped, to be resumed
        self._asked: dict[str, float] = {}
        self._mpi = srun_plugin()

    @property
    def alive_folder(self) -> str:
        return os.path.join(self.payload, heartbeat.FOLDER)

    @property
    def manifest(self) -> SweepManifest:
        return self.controller.manifest

    def run(self) -> SweepManifest:
        log.info("trials run as job steps across the %d node(s) of Slurm job %s, up to %d "
                 "at once", len(self.places.alive), self.places.allocation.job_id,
                 self._limit())
        with self._forwarding():
            try:
                while self.running or (not self.stopping and (self.queue or not self.done)):
                    self._start_what_fits()
                    answer_files(self.payload, self.controller)
                    self._collect_ended()
                    self._leave_out_lost()
                    time.sleep(POLL_S)
            except BaseException as exc:
                end_steps(self.running.values(), self.places.allocation.job_id)
                if isinstance(exc, KeyboardInterrupt):
                    self._interrupted()
                raise
        if self.stopping and (self.queue or self.stopped or not self.done):
            self._stop()
        return self.manifest

    def _limit(self) -> int:
        return min(self.max_concurrent or self.places.capacity(), self.places.capacity())

    def _start_what_fits(self) -> None:
        while not self.stopping and len(self.running) < self._limit():
            if not self.queue and self.done:
                return
            nodes = self.places.take()
            if nodes is None:
                break
            assignment = self.queue.popleft() if self.queue else self.controller.next_trial()
            if not isinstance(assignment, Assignment):
                self.places.release(nodes)
                self.done = assignment is None and not self.running
                return
            self._start(assignment, nodes)
        if (self.queue or not self.done) and not self.running and not self.places.capacity():
            self._no_node_left()

    def _start(self, assignment: Assignment, nodes: tuple[str, ...]) -> None:
        trial, index = assignment.trial, assignment.trial.index
        self.assigned[index] = assignment
        with open(assignment_path(self.payload, index) + ".part", "wb") as f:
            pickle.dump(assignment, f)
        os.replace(assignment_path(self.payload, index) + ".part",
                   assignment_path(self.payload, index))
        for node in nodes:  # silent until this step's rank beats, not stale
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.alive_folder, node))
        env = {variable("sweep_payload"): self.payload, variable("sweep_trial"): str(index),
               variable("heartbeat"): self.alive_folder,
               variable("attempt"): str(self.failures[index]), variable("progress"): "0",
               variable("started_at"): started_for(self.failures[index], self.settings)}
        self.running[index] = start_step(self.places.allocation, nodes, index,
                                         self.places.per_trial, self._mpi, env, self.settings,
                                         overlap=bool(self.places.lost))
        log.info("trial %s starts on %s", trial.dirname, ",".join(nodes))

    def _collect_ended(self) -> None:
        for index, step in list(self.running.items()):
            code = step.process.poll()
            if code is None:
                continue
            del self.running[index]
            self.places.release(step.nodes)
            self._ended(step, code)

    def _ended(self, step: Step, code: int) -> None:
        trial = self.assigned[step.trial].trial
        ended = (read_outcome(self.payload, step.trial) or self._finished(trial)
                 if code == exits.OK else None)
        if ended is not None:
            self._record(ended)
        elif code == exits.TAKEN:  # another run took the trial's experiment: kept so
            self._record(replace(trial, status=ERROR, error=(
                "ExperimentTakenError: another run took the trial's experiment over")))
        elif code != exits.OK and (not exits.restarts_after(code) or self.stopping):
            self.stopping = True  # stopped or interrupted: the sweep stops with it
            self.stopped.append(step.trial)
            self._record(replace(trial, status=PENDING))  # it resumes in the next run
        else:
            self._failed(step, code)

    def _finished(self, trial: Trial) -> Trial | None:
        """A trial whose step ended well without its outcome file (a shared filesystem that
        has not shown it yet): as its own manifest says it ended."""
        last = finished(self.location.join(trial.dirname))
        return None if last is None else replace(trial, status=TERMINATED, error=None,
                                                 last=jsonable(last))

    def _failed(self, step: Step, code: int) -> None:
        """The step ended without the trial's outcome: its ranks failed, or its node was
        lost. Started again from its last committed checkpoint where its policy allows."""
        if not step.lost:  # a node that died under it may have ended it first
            step.lost = self._lose(lost.lost_nodes(step.nodes))
        trial = self.assigned[step.trial].trial
        why = failure_of(step, code, self.location.join(trial.dirname))
        end_abandoned_attempt(self.location.join(trial.dirname), why)  # where its ranks could not
        failed = self.failures[step.trial]
        if not self.policy.allows(failed):
            log.error("trial %s failed: %s", trial.dirname, why)
            self._record(replace(trial, status=ERROR, error=f"TrainingFailedError: {why}"))
            return
        self.failures[step.trial] += 1
        self.queue.appendleft(self.assigned[step.trial])
        log.warning("trial %s failed on %s (%s); starting it again from its last committed "
                    "checkpoint (%s)", trial.dirname, ",".join(step.nodes), why,
                    self.policy.describe(failed + 1))

    def _leave_out_lost(self) -> None:
        """Nodes of running steps that stopped beating, or never beat, and whose slurmd does
        not answer: never offered again, and their steps given up on."""
        suspects = suspect_nodes(self.running.values(), self.alive_folder, self._asked)
        if not suspects:
            return
        found = self._lose(lost.lost_nodes(suspects))
        for step in self.running.values():
            if found & set(step.nodes):
                step.lost = found & frozenset(step.nodes)
                kill(step, self.places.allocation.job_id)

    def _lose(self, found: frozenset[str]) -> frozenset[str]:
        found = found - self.places.lost
        if found:
            self.places.lose(found)
            log.warning("node(s) %s of Slurm job %s lost (their slurmd does not answer); "
                        "their trials start again on the other nodes", ",".join(sorted(found)),
                        self.places.allocation.job_id)
        return found

    def _no_node_left(self) -> None:
        allocation = self.places.allocation
        said = (f"node(s) {','.join(sorted(self.places.lost))} of Slurm job "
                f"{allocation.job_id} lost, and no node is left for the sweep's "
                "trials left to run. Finished trials and every trial's "
                "committed checkpoints are kept: requeue the job, or run the same command "
                "in a new one, and the sweep resumes.")
        if requeued_instead(said, self.settings):
            raise SystemExit(exits.STOPPED)
        raise uncaught.shown_elsewhere(LaunchError(said))

    def _stop(self) -> None:
        """A stop reached the sweep with trials left: it ends, continued by a requeue (the
        trials that took the stop asked Slurm for it; where none did, this process asks)."""
        said = ("the sweep stopped with trials left to run or resume; running the same "
                "command again continues it")
        if self.stopped:
            log.warning("%s", said)
        else:
            requeued_instead(said, self.settings)
        raise SystemExit(exits.STOPPED)

    def _interrupted(self) -> NoReturn:
        log.warning("sweep interrupted; finished trials are kept and interrupted ones resume "
                    "from their latest checkpoints. To go on, run the same command again.")
        stop.interrupt_handled()
        raise uncaught.shown_elsewhere(KeyboardInterrupt())

    def _record(self, trial: Trial) -> None:
        """How the trial's step ended, told to the controller."""
        self.controller.on_ended(trial)

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


class Places:
    """The allocation's free places for trials of ``per_trial`` ranks. Pure bookkeeping:
    which nodes are lost and how many trials each node runs."""

    def __init__(self, allocation: Allocation, per_trial: int) -> None:
        self.allocation = allocation
        self.per_trial = per_trial
        self.lost: frozenset[str] = frozenset()
        self._running: Counter[str] = Counter()

    @property
    def per_node(self) -> int:
        """How many trials one node holds (0: a trial takes whole nodes)."""
        return self.allocation.tasks_per_node // self.per_trial

    @property
    def alive(self) -> tuple[str, ...]:
        return tuple(n for n in self.allocation.nodes if n not in self.lost)

    def take(self) -> tuple[str, ...] | None:
        """The nodes of the next trial, the least busy first (Slurm's order among equals);
        None when no place is free."""
        nodes: tuple[str, ...]
        if self.per_node:
            free = [n for n in self.alive if self._running[n] < self.per_node]
            if not free:
                return None
            nodes = (min(free, key=lambda n: self._running[n]),)
        else:
            idle = [n for n in self.alive if not self._running[n]]
            needed = self.allocation.needed(self.per_trial)
            if len(idle) < needed:
                return None
            nodes = tuple(idle[:needed])
        self._running.update(nodes)
        return nodes

    def release(self, nodes: tuple[str, ...]) -> None:
        """A trial on ``nodes`` ended."""
        self._running.subtract(nodes)

    def lose(self, nodes: frozenset[str]) -> None:
        self.lost |= nodes

    def capacity(self) -> int:
        """How many trials the nodes not lost hold at once."""
        if self.per_node:
            return len(self.alive) * self.per_node
        return len(self.alive) // self.allocation.needed(self.per_trial)
