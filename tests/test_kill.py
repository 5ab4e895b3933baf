"""SIGKILL at every phase of the commit protocol, and at random times, many times over.

After every trial: the manifest parses, every checkpoint it names is complete (sizes and
checksums), nothing committed earlier is lost, and the next run resumes from the newest complete
checkpoint after removing the leftovers. Each chain of trials then finishes with exactly the
result of an uninterrupted run. The figures go to the session summary (docs/reliability.md).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from support import reliability
from conftest import HERE, MPIEXEC, Run, manifest, mpiexec
from support.once import computed_once

from hpckit.experiment.manifest import checkpoint_dirname
from hpckit.experiment.reading import read_manifest
from hpckit.faults import PHASES
from hpckit.storage import files as _storage
from hpckit.storage.location import resolve

SHARDED = HERE / "ranks" / "sharded.py"
RANKS = 3
# In CI a phase's chain kills each victim (every rank that reaches the phase, and the whole
# job) once, and every occurrence the phase is killed at, and every write mode, is met by some
# victim: one round. HPCKIT_KILL_TRIALS=N plans every victim at every occurrence instead,
# repeated into chains of at least N trials, the longer chains that docs/reliability.md's
# table counts.
TRIALS = int(os.environ.get("HPCKIT_KILL_TRIALS", "0"))
RANDOM_TRIALS = max(12, TRIALS)
# On S3 each asynchronous phase is killed at most 4 times, each synchronous phase twice: the
# same code paths as on local storage, and S3 makes every trial slower.
S3_ASYNC_TRIALS = max(4, TRIALS // 2)
S3_TRIALS_A_PHASE = max(2, TRIALS // 5)
# A chain's runs advance a few checkpoints each (evicting's 9th eviction comes at the 11th):
# one round ends within 20 epochs, the longer chains within 48.
PHASE_EPOCHS = 48 if TRIALS else 28
RANDOM_EPOCHS = 400  # 20 trials at most, each a few to 15 epochs further on: the last still has work to kill
SHARD = "65536"  # floats per file: 512 KiB, seven files per checkpoint
QUICK = {"HPCKIT_TENSORBOARD": "0"}  # saves rank 0 half a second per launch, 130 launches
ASYNC = ("taking", "handed", "background", "persisted", "committing")
HANDED = ("taking", "handed")  # met only where a directory is handed over, never in place
SAVE_STATE = ("staging", "serialising")  # hpckit.torch.save_state's, then reported ASYNC
BEFORE_COMMIT = ("writing", "written", "gathered", *ASYNC)
ROOT_ONLY = ("gathered", "committed", "evicting", "committing", "validating")
VALIDATING = ("validating",)  # a committed checkpoint's validation process has started
# Phases of node-local caches, which need nodes of their own: tests/test_multilevel.py kills
# ranks there (a partner copy, a drain to storage_path).
CACHED = ("partnering", "draining")
# A rank's resume state is written only where it keeps one (a TorchTrainer, a prepared
# loader): tests/test_exact_resume.py kills ranks there, on torch ranks.
TORCH_ONLY = ("resume_state",)
# A sweep's PBT exploit, copying a donor's checkpoint: tests/test_tune_schedulers.py kills there.
SWEEP_ONLY = ("exploiting",)
STORAGE_PHASES = tuple(p for p in PHASES if p not in CACHED + TORCH_ONLY + SWEEP_ONLY)
OCCURRENCES = {"writing": (1, 3), "written": (1, 2), "gathered": (1, 2), "committed": (1, 2),
               "evicting": (1, 4, 9), "taking": (1, 4), "handed": (1, 3), "background": (1, 4), "persisted": (1, 2),
               "staging": (1, 3), "serialising": (1, 4), "committing": (1, 2),
               "validating": (1, 2)}
# report(checkpoint_upload_fn=..., ASYNC): each rank's upload, then its share hashed, on the
# background thread. Two kills a phase: the commit after it is the in-place one, killed above.
UPLOADS = ("background", "persisted", "committing")
UPLOAD_TRIALS = 6
# Rank 0 commits off the collective only when the ranks train between reports long enough
# for the background checkpoint to finish (else the next report drains it, synchronously).
TRAINING = {"committing": ("--epoch-seconds", "0.25"),
            "validating": ("--validate", "--epoch-seconds", "0.4")}


@dataclass(frozen=True)
class Kill:
    """One trial of a chain: who dies (a rank, or ``None`` for the whole job), at which time it
    reaches the phase, and how the checkpoints are written."""

    rank: int | None
    occurrence: int
    mode: str


def modes_for(phase: str) -> tuple[str, ...]:
    """The asynchronous phases alternate between handed directories and in-place writes
    (which hand nothing over, so never meet ``taking`` or ``handed``)."""
    if phase in SAVE_STATE:
        return ("save-state",)
    if phase not in ASYNC:
        return ("sync",)
    return ("async",) if phase in HANDED else ("async", "in-place-async")


def kills(phase: str, at_least: int = TRIALS) -> list[Kill]:
    """The phase's chain: one round (see :func:`one_round`) when it is long enough, else
    every victim at every occurrence, repeated to ``at_least`` trials."""
    victims: list[int | None] = [0] if phase in ROOT_ONLY else list(range(RANKS))
    victims.append(None)
    times, modes = OCCURRENCES[phase], modes_for(phase)
    if at_least <= max(len(victims), len(times)):
        return one_round(victims, times, modes)
    # Diagonals first, so that the first trials already differ in victim and occurrence; the
    # mode turns with victim and occurrence, so each of them meets every mode.
    pairs = sorted(itertools.product(range(len(victims)), range(len(times))),
                   key=lambda vt: ((vt[1] - vt[0]) % len(times), vt[0]))
    plan = [Kill(victims[v], times[t], modes[(v + t) % len(modes)]) for v, t in pairs]
    return plan * -(-at_least // len(plan))


def one_round(victims: list[int | None], times: tuple[int, ...],
              modes: tuple[str, ...]) -> list[Kill]:
    """Each victim killed once and each occurrence met, in as few trials as that takes; the
    mode turns a step further after each pass over the occurrences, so that every occurrence
    meets every mode once there are trials enough (four, with two of each)."""
    return [Kill(victims[i % len(victims)], times[i % len(times)],
                 modes[(i + i // len(times)) % len(modes)])
            for i in range(max(len(victims), len(times)))]


def args(storage: Path | str, epochs: int, mode: str = "sync") -> list[str]:
    return ["--storage", str(storage), "--epochs", str(epochs), "--shard-floats", SHARD,
            "--mode", mode]


def finished(experiment: str, epochs: int, run: Run) -> tuple[list[str], list[tuple[int, float]]]:
    """The final shards' digests and the (step, loss) history of a run that finished."""
    line = run.line("FINAL")
    assert line is not None, f"the run did not finish:\n{run.output}"
    text = _storage.read_bytes(resolve(experiment).join("metrics.jsonl")).decode()
    history = [(m["step"], m["metrics"]["loss"]) for m in map(json.loads, text.splitlines())]
    assert [s for s, _ in history] == list(range(epochs)), f"steps are missing or repeated: {history}"
    return json.loads(line)["shards"], history


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory):
    """The result of an uninterrupted run, by number of epochs (computed once a test run
    each, whichever worker asks first)."""
    def of(epochs: int) -> tuple[list[str], list[tuple[int, float]]]:
        def compute() -> tuple[list[str], list[tuple[int, float]]]:
            storage = tmp_path_factory.mktemp("reference")
            return finished(str(storage / "exp"), epochs, mpiexec(
                RANKS, *args(storage, epochs), script=SHARDED, env=QUICK, timeout=120))

        shards, history = computed_once(tmp_path_factory, f"kill-reference-{epochs}", compute)
        return shards, [(step, loss) for step, loss in history]
    return of


RESUMING = r"resuming experiment \S+ from (\S+)"
READY = r"rank\(s\) on \d+ node\(s\) ready in [\d.]+ s .*; experiment \S+"


def log_of(run: Run) -> str:
    return re.sub(r"\[\d+\] ", "", run.output)


def check_resumed(run: Run, before: reliability.State) -> None:
    """A run that got to train: it opened the experiment as ``before`` left it, its ranks were
    ready, and it removed the leftovers."""
    check_opened(run, before)
    check_ready(run, before)


def check_resumed_from(after: reliability.State, before: reliability.State) -> None:
    """The attempt the run added records the checkpoint it resumed from: the newest complete
    one ``before`` names (none where there was none: it started from the beginning)."""
    assert len(after.resumed_from) > before.attempts, f"the run recorded no attempt: {after}"
    assert after.resumed_from[before.attempts] == before.latest, \
        f"attempt {before.attempts} records resuming from " \
        f"{after.resumed_from[before.attempts]}, not {before.latest}"


def check_opened(run: Run, before: reliability.State) -> None:
    """The run resumed the experiment from the newest complete checkpoint (from its start when
    none was committed) once a run had written its manifest, and started it afresh before."""
    found = re.search(RESUMING, log_of(run))
    if not before.opened:
        assert found is None, f"a new experiment was resumed from {found.group(1)}:\n{run.output}"
        return
    assert found is not None, f"the run did not log that it resumed the experiment:\n{run.output}"
    assert found.group(1) == (before.latest or "its"), \
        f"resumed from {found.group(1)}, but the newest complete checkpoint is {before.latest}"


def check_ready(run: Run, before: reliability.State) -> None:
    """The ranks were ready to train, the leftovers ``before`` lists removed on the way."""
    text = log_of(run)
    assert re.search(READY, text), f"the run did not log that its ranks were ready:\n{run.output}"
    for leftover in before.leftovers:
        assert re.search(rf"removed leftovers .*{leftover}", text), \
            f"leftover {leftover} was not removed on resume:\n{run.output}"


def check_started_before_a_random_kill(run: Run, before: reliability.State,
                                       after: reliability.State, whole_job: bool) -> None:
    """A kill at a random time may land before the run opened the experiment, or before its
    ranks were ready; what the experiment shows the run did, its log must say. Opening it
    records the run's attempt in the manifest, just after logging how it opened it; a
    checkpoint it committed came after its ranks were ready. Only a kill of the whole job,
    the launcher with it, can lose lines on their way out, and none that came before a commit."""
    opened = after.attempts > before.attempts
    committed = after.latest != before.latest
    if committed or (opened and not whole_job):
        check_opened(run, before)
    if committed:
        check_ready(run, before)
    else:
        assert opened or not re.search(READY, log_of(run)), \
            f"the ranks were ready, yet the manifest records no attempt of the run: {after}"


def fault_for(phase: str, kill: Kill) -> tuple[str, str]:
    """The fault's spec, and who it kills."""
    rank = 0 if kill.rank is None else kill.rank
    spec = f"{phase}:{rank}:{kill.occurrence}" + (":all" if kill.rank is None else "")
    return spec, "whole job" if kill.rank is None else f"rank {rank}"


def in_flight_at(phase: str, occurrence: int, before: reliability.State,
                 after: reliability.State) -> str:
    """The checkpoint that an asynchronous or save_state kill at the N-th occurrence caught in
    flight: the run's N-th, where each checkpoint meets the phase once (on each rank). A
    checkpoint meets ``background`` once a file, so there the N-th is the newest it can be;
    only commits made off the collective meet ``committing``, so there it is the oldest, and
    rank 0 commits in order: the caught one is the oldest leftover from the N-th on."""
    nth = checkpoint_dirname(before.next_index + occurrence - 1)
    if phase == "committing":
        return min((name for name in after.leftovers if name >= nth), default=nth)
    return nth


def kill_trial(storage: str, experiment: str, phase: str, kill: Kill, state: reliability.State,
               suite: str) -> reliability.State:
    """One run killed at ``phase``; checks what it left and that it resumed right."""
    spec, victim = fault_for(phase, kill)
    run = mpiexec(RANKS, *args(storage, PHASE_EPOCHS, kill.mode), *TRAINING.get(phase, ()),
                  script=SHARDED, expect=None,
                  env={**QUICK, "HPCKIT_FAULT": spec}, timeout=90)
    assert run.returncode != 0 and run.line("FINAL") is None, \
        f"{kill}: fault {spec} never fired:\n{run.output}"
    check_resumed(run, state)  # every hook is reached in training, after both lines
    after = reliability.check_experiment(experiment, state)
    check_resumed_from(after, state)
    in_flight = max(after.leftovers + after.committed, default=None)
    if phase in VALIDATING:
        # Killed with the validation process: the checkpoint stays committed and pending.
        assert after.latest is not None and after.latest >= (state.latest or ""), after
        outcome = "validation left pending, committed checkpoint kept"
    elif phase in ASYNC + SAVE_STATE:
        # The checkpoint in flight may have reached only staging, not its directory: which
        # one it is follows from the occurrence.
        caught = in_flight_at(phase, kill.occurrence, state, after)
        kept = after.latest is not None and after.latest >= caught
        outcome = f"in-flight checkpoint {'kept' if kept else 'discarded'} ({kill.mode})"
        assert not kept, \
            f"{kill} ({spec}): {caught}, killed before its commit, is visible: {after}"
    elif phase in BEFORE_COMMIT:
        assert in_flight is not None and in_flight not in after.committed, \
            f"{kill} ({spec}): a checkpoint killed before its commit is visible: {after}"
        outcome = "in-flight checkpoint discarded"
    else:
        assert in_flight == after.latest and after.latest != state.latest, \
            f"{kill} ({spec}): the manifest was replaced but {after} lacks it"
        outcome = "in-flight checkpoint kept"
    reliability.record(suite, phase, outcome, victim=victim, lost=after.lost_since(state))
    return after


def finish_chain(storage: str, experiment: str, state: reliability.State, reference,
                 mode: str = "sync", extra: tuple[str, ...] = ()) -> None:
    """The run that completes a chain: resumed right, and equal to an uninterrupted one."""
    run = mpiexec(RANKS, *args(storage, PHASE_EPOCHS, mode), *extra, script=SHARDED,
                  env=QUICK, timeout=180)
    check_resumed(run, state)
    assert finished(experiment, PHASE_EPOCHS, run) == reference(PHASE_EPOCHS)
    end = reliability.check_experiment(experiment, state)
    check_resumed_from(end, state)
    assert not end.leftovers and not end.temp_files and len(end.committed) == 2, end
    assert not end.lost, f"committed checkpoints that retention keeps were lost: {end.lost}"
    assert ".staging" not in [i.base_name for i in _storage.list_dir(resolve(experiment))]


@pytest.mark.parametrize("phase", STORAGE_PHASES)
def test_sigkill_at_each_commit_phase_loses_nothing(phase, tmp_path, reference):
    state = reliability.State(None, [])
    for kill in kills(phase):
        state = kill_trial(str(tmp_path), str(tmp_path / "exp"), phase, kill, state,
                           "SIGKILL at a hook")
    finish_chain(str(tmp_path), str(tmp_path / "exp"), state, reference, modes_for(phase)[0],
                 TRAINING.get(phase, ()) if phase in VALIDATING else ())
    if phase in VALIDATING:  # every kept checkpoint that asked for it ends validated, once
        kept = read_manifest(resolve(str(tmp_path / "exp"))).checkpoints
        validated = [r.validation.status for r in kept if r.validation]
        assert validated and validated == ["VALIDATED"] * len(validated), kept


def test_sigkill_at_every_phase_on_s3_loses_nothing(s3, tmp_path, reference, monkeypatch):
    """The same checks with the experiment on the S3 server, each synchronous phase in turn,
    every checkpoint's records in a file of their own (manifest format 5): a kill after that
    file is written and before the manifest names it leaves a leftover, an eviction removes
    it after the manifest stops naming it."""
    monkeypatch.setenv("HPCKIT_INLINE_RECORDS", "0")
    storage = s3.uri(f"kill-{tmp_path.name}")
    experiment = storage.replace("?", "/exp?", 1)
    synchronous = [p for p in STORAGE_PHASES if p not in ASYNC + SAVE_STATE + VALIDATING]
    state = reliability.State(None, [])
    chain = [(phase, kill) for n in range(S3_TRIALS_A_PHASE) for phase in synchronous
             for kill in kills(phase, S3_TRIALS_A_PHASE)[n:n + 1]]
    for phase, kill in chain:
        state = kill_trial(storage, experiment, phase, kill, state, "SIGKILL at a hook, on S3")
    finish_chain(storage, experiment, state, reference)
    kept = read_manifest(resolve(experiment)).checkpoints
    assert kept and all(r.records is not None for r in kept), kept


@pytest.mark.parametrize("phase", ASYNC)
def test_sigkill_in_asynchronous_checkpoints_on_s3_loses_nothing(phase, s3, tmp_path, reference,
                                                                 monkeypatch):
    """Kills at each phase of an asynchronous checkpoint, with the experiment on S3, the
    ranks in nodes of two (2 and 1) and every checkpoint's records apart: those handed are
    written by the node leaders, a part per node, once the node's ranks have finished."""
    monkeypatch.setenv("HPCKIT_INLINE_RECORDS", "0")
    monkeypatch.setenv("HPCKIT_RANKS_PER_NODE", "2")
    storage = s3.uri(f"kill-{phase}-{tmp_path.name}")
    experiment = storage.replace("?", "/exp?", 1)
    state = reliability.State(None, [])
    for kill in kills(phase, S3_ASYNC_TRIALS)[:S3_ASYNC_TRIALS]:
        state = kill_trial(storage, experiment, phase, kill, state,
                           "SIGKILL at a hook, asynchronous, on S3")
    finish_chain(storage, experiment, state, reference, "async")
    kept = read_manifest(resolve(experiment)).checkpoints
    assert kept and all(r.records is not None and r.records.parts == 2 for r in kept), kept


def test_sigkill_in_uploaded_checkpoints_loses_nothing(tmp_path, reference):
    """Kills while the ranks' own checkpoint_upload_fn uploads run, meet and are hashed in the
    background, and while rank 0 commits them."""
    state = reliability.State(None, [])
    chain = [(phase, replace(kill, mode="upload-async")) for n in range(UPLOAD_TRIALS // len(UPLOADS))
             for phase in UPLOADS for kill in kills(phase)[n:n + 1]]
    for phase, kill in chain:
        state = kill_trial(str(tmp_path), str(tmp_path / "exp"), phase, kill, state,
                           "SIGKILL at a hook, checkpoint_upload_fn")
    finish_chain(str(tmp_path), str(tmp_path / "exp"), state, reference, "upload-async")


def test_sigkill_at_random_times_loses_nothing(tmp_path, reference):
    rng = random.Random(20261121)
    experiment = tmp_path / "exp"
    state = reliability.State(None, [])
    command = [MPIEXEC, "-prepend-rank", "-n", str(RANKS), sys.executable, str(SHARDED),
               *args(tmp_path, RANDOM_EPOCHS), "--epoch-seconds", "0.005"]
    for trial in range(RANDOM_TRIALS):
        pids = tmp_path / f"pids-{trial}"
        pids.mkdir()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True,
                                   env={**os.environ, **QUICK, "HPCKIT_PID_DIR": str(pids)})
        time.sleep(rng.uniform(0.5, 1.1))
        ranks = sorted(os.listdir(pids))
        if ranks and rng.random() < 0.75:
            victim = "one rank"
            try:
                os.kill(int(rng.choice(ranks)), signal.SIGKILL)
            except ProcessLookupError:  # it ended first: the checks below say how
                victim = "none (the chosen rank had already ended)"
        else:
            victim = "whole job"
            os.killpg(process.pid, signal.SIGKILL)
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"trial {trial}: the job hung after a rank was killed:\n"
                        f"{process.communicate()[0]}")
        run = Run(process.returncode, output)
        assert run.line("FINAL") is None, f"trial {trial} finished before the kill; lower the delay"
        if victim.startswith("none"):
            assert "exited before MPI start-up completed" not in output, output
        after = reliability.check_experiment(experiment, state)
        check_started_before_a_random_kill(run, state, after, victim == "whole job")
        outcome = ("killed before it opened the experiment" if after.attempts == state.attempts
                   else "killed mid-commit" if after.leftovers or after.temp_files
                   else "killed between commits")
        reliability.record("SIGKILL at a random time", "random", outcome, victim=victim,
                           lost=after.lost_since(state))
        state = after
    run = mpiexec(RANKS, *args(tmp_path, RANDOM_EPOCHS), script=SHARDED, env=QUICK, timeout=120)
    check_resumed(run, state)
    assert finished(str(experiment), RANDOM_EPOCHS, run) == reference(RANDOM_EPOCHS)
    end = reliability.check_experiment(experiment, state)
    check_resumed_from(end, state)
    assert not end.leftovers and not end.temp_files, end
    assert not end.lost, f"committed checkpoints that retention keeps were lost: {end.lost}"


WIDE = HERE / "ranks" / "wide.py"
WIDE_RANKS, WIDE_EPOCHS = 64, 3


@pytest.mark.alone  # 64 ranks load both cores: a test beside it (a Slurm job's ranks) crawls
def test_sixty_four_ranks_one_killed_mid_commit_rerun_is_exact(tmp_path):
    """64 oversubscribed ranks, each with state of its own, hand a checkpoint every epoch (65
    files: each rank's, and one every rank hands alike); rank 37 is SIGKILLed after writing its
    share of the second checkpoint, before the commit. The rerun resumes from the first, the
    second never became visible, and every rank ends with exactly the state of a run that was
    never killed, each step logged once. The steps gather through node leaders: nodes of 8
    ranks, then of 5 on the rerun (the last node holds 4); each checkpoint's records are kept
    apart (HPCKIT_INLINE_RECORDS=0), so the leaders write them, a part per node, and the
    killed checkpoint's parts go with its directory."""
    sys.path.insert(0, str(WIDE.parent))
    from wide import expected

    args = ("--storage", str(tmp_path), "--epochs", str(WIDE_EPOCHS))
    killed = mpiexec(WIDE_RANKS, *args, script=WIDE, expect=None, timeout=240,
                     env={**QUICK, "HPCKIT_FAULT": "written:37:2", "HPCKIT_RANKS_PER_NODE": "8",
                          "HPCKIT_INLINE_RECORDS": "0"})
    assert killed.returncode != 0 and killed.line("FINAL") is None, \
        f"rank 37 was not killed:\n{killed.output}"
    state = reliability.check_experiment(tmp_path / "wide", None)
    assert state.committed == ["checkpoint_000000"], state
    rerun = mpiexec(WIDE_RANKS, *args, script=WIDE, timeout=240,
                    env={**QUICK, "HPCKIT_RANKS_PER_NODE": "5", "HPCKIT_INLINE_RECORDS": "0"})
    check_resumed(rerun, state)
    line = rerun.line("FINAL")
    assert line is not None and json.loads(line) == \
        [expected(rank, WIDE_EPOCHS) for rank in range(WIDE_RANKS)], rerun.output
    end = reliability.check_experiment(tmp_path / "wide", state)
    check_resumed_from(end, state)
    assert not end.leftovers and not end.temp_files and not end.lost, end
    text = (tmp_path / "wide" / "metrics.jsonl").read_text()
    assert [json.loads(entry)["step"] for entry in text.splitlines()] == list(range(WIDE_EPOCHS))
    parts = {c["directory"]: c["records"]["parts"] for c in manifest(tmp_path / "wide")["checkpoints"]}
    assert parts == {"checkpoint_000000": 8, "checkpoint_000001": 13, "checkpoint_000002": 13}, parts
