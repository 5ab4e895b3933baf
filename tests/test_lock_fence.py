"""The lock is a fence (issue 39): a run frozen past the stale time, whose experiment another
run took over meanwhile, writes nothing more when it wakes and fails at its next report on
every rank with one error that names the other run, and exits 77, which nothing restarts;
the other run ends exactly as an uninterrupted one. A refresh that fails is retried, and the
lock is lost only once no refresh succeeded for the stale time.

The frozen run is frozen for real (SIGSTOP to its process group, SIGCONT later); only the
refresh failures are made by replacing the storage write, a fault that cannot be timed."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs
import pytest
from conftest import HERE, HPCKIT, MPIEXEC, mpiexec, run
from support.once import computed_once
from support.processes import tree

from hpckit import exits
from hpckit import ExperimentTakenError
from hpckit.errors import HpckitError
from hpckit.config import CheckpointConfig
from hpckit.experiment.attempts import Attempt, AttemptStatus
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.lock import LOCK_NAME, Holder, Lock
from hpckit.experiment.manifest import CheckpointRecord, Manifest, checkpoint_dirname
from hpckit.experiment.metrics import MetricsLog
from hpckit.experiment.reading import read_manifest
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import resolve

# A run is frozen past a stale time of seconds, and refreshes fail for set times: no busy test
# runs beside these tests.
pytestmark = pytest.mark.waiting

SHARDED = HERE / "ranks" / "sharded.py"
STALE = 3.0  # HPCKIT_LOCK_STALE_SECONDS; the holder refreshes every max(1 s, a fifth of it)
EPOCHS = 6
ARGS = ("--epochs", str(EPOCHS), "--epoch-seconds", "0.4")


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 60,
               process: subprocess.Popen | None = None, log: Path | None = None) -> Any:
    """Poll ``condition`` until it returns something true; fail naming ``what`` (with the
    output of ``process``, from ``log``) if it never does or ``process`` ends first."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        ended = process is not None and process.poll() is not None
        if ended or time.monotonic() > deadline:
            output = log.read_text() if log is not None else ""
            pytest.fail(f"{what}: {'the run ended first' if ended else 'timed out'}\n{output}")
        time.sleep(0.02)
    return found


# --- refreshes: a brief failure is ridden out, one past the stale time loses the lock ---

def flaky_writes(monkeypatch, lock_path: str, failures: list[BaseException | None]) -> list[str]:
    """The lock's writes raise the next of ``failures`` (None: write) while any are left,
    then write as usual; returns the log of what each write did."""
    write, done = files.write_atomic, []

    def writing(location, data: bytes) -> None:
        if location.path == lock_path and failures:
            failure = failures.pop(0) if len(failures) > 1 else failures[0]
            if failure is not None:
                done.append(type(failure).__name__)
                raise failure
        write(location, data)
        done.append("written" if location.path == lock_path else "other")

    monkeypatch.setattr(files, "write_atomic", writing)
    return done


@pytest.mark.quick
def test_a_refresh_that_fails_briefly_is_ridden_out(tmp_path, monkeypatch):
    experiment = resolve(str(tmp_path))
    lock = Lock.acquire(experiment, Settings.read({"HPCKIT_LOCK_STALE_SECONDS": str(STALE)}))
    try:
        # Two refreshes fail, neither with an hpckit error; the third writes.
        done = flaky_writes(monkeypatch, lock.location.path,
                            [OSError("injected: storage unreachable"),
                             RuntimeError("injected: not a storage error"), None])
        wait_until(lambda: "written" in done, "a refresh after the failures", timeout=20)
        assert done[:3] == ["OSError", "RuntimeError", "written"], done
        assert lock.lost is None
        lock.confirm()  # still this run's: a write would be made
        refreshed = json.loads((tmp_path / LOCK_NAME).read_text())
        assert refreshed["token"] == lock.holder.token and refreshed["refreshed_at"] > \
            refreshed["started_at"]
    finally:
        lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.quick
def test_a_refresh_failing_past_the_stale_time_loses_the_lock(tmp_path, monkeypatch):
    experiment = resolve(str(tmp_path))
    acquired = time.monotonic()
    lock = Lock.acquire(experiment, Settings.read({"HPCKIT_LOCK_STALE_SECONDS": str(STALE)}))
    done = flaky_writes(monkeypatch, lock.location.path, [OSError("injected: storage unreachable")])
    lost = wait_until(lambda: lock.lost, "the lock lost after the stale time", timeout=20)
    assert time.monotonic() - acquired >= STALE, "lost before the lease could have expired"
    assert len(done) >= 2 and set(done) == {"OSError"}, done  # retried until then
    assert f"HPCKIT_LOCK_STALE_SECONDS={STALE:g}" in str(lost) and experiment.display in str(lost)
    with pytest.raises(ExperimentTakenError):
        lock.confirm()
    lock.release()
    # Lost: not removed, as a killed run's lock is not; it goes stale for the next run.
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == lock.holder.token


# --- the fence in-process: no write once another run holds the lock ---

def another_runs_lock(experiment: Path) -> str:
    text = json.dumps({"token": "0" * 32, "host": "node-elsewhere", "pid": 1, "job_id": "77",
                       "run_id": "run-B", "started_at": time.time(), "refreshed_at": time.time()})
    (experiment / LOCK_NAME).write_text(text)
    return text


def record(index: int) -> CheckpointRecord:
    return CheckpointRecord(index, checkpoint_dirname(index), index, 0.0, {"loss": 1.0}, ())


@pytest.mark.quick
@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_no_write_is_made_once_the_lock_is_another_runs(tmp_path, how):
    location = resolve(str(tmp_path))
    lock = Lock.acquire(location, Settings.read({"HPCKIT_LOCK_STALE_SECONDS": "60"}))
    manifest = Manifest("exp", 1, {}, {}, {}, 0.0).with_attempt(
        Attempt(0, AttemptStatus.RUNNING, host=socket.gethostname(), pid=os.getpid()))
    experiment = Experiment(location, manifest, lock, MetricsLog.resume(location, 0))
    experiment.commit(record(0), CheckpointConfig())
    (tmp_path / checkpoint_dirname(1)).mkdir()
    theirs = another_runs_lock(tmp_path) if how == "replaced" else None
    if theirs is None:
        (tmp_path / LOCK_NAME).unlink()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(ExperimentTakenError) as taken:
        experiment.commit(record(1), CheckpointConfig())
    message = str(taken.value)
    assert ("host node-elsewhere, pid 1, Slurm job 77" if theirs else "is gone") in message
    assert f"hpckit verify {location.display}" in message
    with pytest.raises(ExperimentTakenError):
        experiment.check_lock()  # the next collective step fails on every rank
    experiment.discard(checkpoint_dirname(1))  # may be the other run's now: kept
    with pytest.raises(ExperimentTakenError):
        experiment.log_report(2, {"loss": 0.5})  # a metrics line is a write too
    experiment.end_attempt(AttemptStatus.FAILED, "ExperimentTakenError")
    experiment.close()  # releases nothing: the lock is the other run's
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before, "a write was made after the lock was lost"
    assert (tmp_path / checkpoint_dirname(1)).is_dir()
    assert json.loads(after.get(LOCK_NAME, b"null")) == (json.loads(theirs) if theirs else None)


def running(location: Any, settings: Settings) -> tuple[Experiment, Lock]:
    """An experiment that this process's run holds, as rank 0 holds it."""
    lock = Lock.acquire(location, settings)
    manifest = Manifest("exp", 1, {}, {}, {}, 0.0).with_attempt(
        Attempt(0, AttemptStatus.RUNNING, host=socket.gethostname(), pid=os.getpid()))
    return Experiment(location, manifest, lock, MetricsLog.resume(location, 0)), lock


@pytest.mark.quick
def test_a_manifest_write_checked_just_before_a_takeover_does_not_land_after_it(
        tmp_path, monkeypatch):
    """The CI of a stop failed ``gc --force`` beside a live run: the run's commit passed its
    check of the lock, gc took the lock over, read the manifest and wrote its own, and then
    the run's manifest landed over gc's, naming what gc was about to delete. Here the
    takeover (gc --force, in-process) is made at that moment, between the check and the
    write: the run's write fails as a lost lock, and gc's manifest stands."""
    location, settings = resolve(str(tmp_path)), Settings.read({"HPCKIT_LOCK_STALE_SECONDS": "60"})
    experiment, lock = running(location, settings)
    for index in range(3):
        (tmp_path / checkpoint_dirname(index)).mkdir()
        experiment.commit(record(index), CheckpointConfig())
    (tmp_path / checkpoint_dirname(3)).mkdir()
    confirm, collected = Lock.confirm, []

    def checked_then_taken_over(self: Lock) -> None:
        confirm(self)
        callers = {sys._getframe(depth).f_code.co_name for depth in range(1, 6)}
        if self is lock and "_replace" in callers and not collected:  # the manifest's check
            gc = Experiment.for_maintenance(location, settings, force=True)
            try:
                collected.append(gc.collect_garbage(keep=1, dry_run=False))
            finally:
                gc.close()

    monkeypatch.setattr(Lock, "confirm", checked_then_taken_over)
    with pytest.raises(ExperimentTakenError):
        experiment.commit(record(3), CheckpointConfig())
    experiment.end_attempt(AttemptStatus.FAILED, "ExperimentTakenError")
    experiment.close()
    assert [r.directory for r in collected[0].evicted] == [checkpoint_dirname(0),
                                                           checkpoint_dirname(1)]
    on_disk = read_manifest(location)
    assert [r.directory for r in on_disk.checkpoints] == [checkpoint_dirname(2)]
    assert all((tmp_path / r.directory).is_dir() for r in on_disk.checkpoints)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".hpckit-fence")]


@pytest.mark.quick
def test_a_manifest_rename_that_fails_or_a_kill_before_it_leaves_the_commit_undone(
        tmp_path, monkeypatch):
    """The run's manifest is staged in its fence directory and renamed over manifest.json:
    a rename that fails leaves the committed manifest and no staged file; a run killed
    between the two leaves its staged manifest there, which the run that takes its lock
    over removes with the directory."""
    location, settings = resolve(str(tmp_path)), Settings.read({"HPCKIT_LOCK_STALE_SECONDS": "60"})
    experiment, lock = running(location, settings)
    (tmp_path / checkpoint_dirname(0)).mkdir()
    experiment.commit(record(0), CheckpointConfig())
    committed = (tmp_path / "manifest.json").read_bytes()
    fence = tmp_path / f".hpckit-fence-{lock.holder.token}"
    rename = os.replace

    def failing(source, target, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(source).startswith(str(fence)):
            raise OSError(5, "injected: the rename failed")
        rename(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing)
    (tmp_path / checkpoint_dirname(1)).mkdir()
    with pytest.raises(HpckitError, match="injected: the rename failed"):
        experiment.commit(record(1), CheckpointConfig())
    monkeypatch.setattr(os, "replace", rename)
    assert (tmp_path / "manifest.json").read_bytes() == committed
    assert experiment.manifest.latest.directory == checkpoint_dirname(0)
    assert list(fence.iterdir()) == []
    # Killed after staging: the staged manifest stays in the dead run's fence directory.
    (fence / "manifest.json.deadbeef").write_bytes(b"{staged by a run killed before its rename")
    lock._stop.set()  # the dead run refreshes nothing more
    taker = Lock.acquire(location, settings, force=True)
    try:
        assert (tmp_path / "manifest.json").read_bytes() == committed
        assert sorted(name for name in os.listdir(tmp_path) if name.startswith(".hpckit-f")) \
            == [f".hpckit-fence-{taker.holder.token}"]
    finally:
        taker.release()
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".hpckit-f")]


# --- the frozen run, on real ranks ---

class LocalView:
    """The experiment directory as the test reads it."""

    def __init__(self, storage: Path) -> None:
        self.storage, self.experiment = str(storage), str(storage / "exp")

    def read(self, name: str) -> bytes | None:
        path = Path(self.experiment) / name
        return path.read_bytes() if path.exists() else None

    def names(self) -> set[str]:
        return set(os.listdir(self.experiment))


class S3View(LocalView):
    def __init__(self, server: Any, prefix: str) -> None:
        self.server, self.prefix = server, prefix
        self.storage, self.experiment = server.uri(prefix), server.uri(f"{prefix}/exp")
        self.fs = server.filesystem()

    def read(self, name: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(f"hpckit/{self.prefix}/exp/{name}") as f:
                data: bytes = f.read()
                return data
        except FileNotFoundError:
            return None

    def names(self) -> set[str]:
        found = self.fs.get_file_info(pyarrow.fs.FileSelector(f"hpckit/{self.prefix}/exp"))
        return {info.base_name for info in found}


def parsed(view: LocalView, name: str) -> Any:
    """The JSON file ``name`` as the run left it, or None where it is absent. On S3 a read
    that overlaps the run's replacing the object may end early (SeaweedFS): read again."""
    for _ in range(20):
        raw = view.read(name)
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:
            time.sleep(0.05)
    raise AssertionError(f"{name} never read whole: {raw!r}")


def committed(view: LocalView) -> bool:
    manifest = parsed(view, "manifest.json")
    return manifest is not None and bool(manifest["checkpoints"])


def stale(view: LocalView) -> bool:
    holder = parsed(view, LOCK_NAME)
    return holder is not None and Holder(**holder).stale(time.time(), STALE) is not None


def signal_run(root: int, signum: int) -> None:
    """``signum`` to every process group of the run started as ``root``."""
    for group in {group for _, group in tree(root).values()}:
        try:
            os.killpg(group, signum)
        except ProcessLookupError:  # ended meanwhile
            pass


def run_stopped(root: int) -> bool:
    """Every process of the run (mpiexec, its proxy, both ranks) is stopped."""
    states = [state for state, _ in tree(root).values()]
    return len(states) >= 4 and all(state in "Tt" for state in states)


def start_frozen_candidate(view: LocalView, log: Path, launcher: list[str] | None = None,
                           more: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCKIT_LOCK_STALE_SECONDS": f"{STALE:g}",
           "HPCKIT_RUN_ID": "run-A"}
    with open(log, "w") as out:
        return subprocess.Popen([*(launcher or [MPIEXEC, "-prepend-rank", "-n", "2",
                                                sys.executable]),
                                 str(SHARDED), "--storage", view.storage, *ARGS, *more],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


@pytest.fixture(scope="session")  # computed once a worker, whatever the order of tests
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The final shards of an uninterrupted run."""
    def compute() -> list[str]:
        storage = tmp_path_factory.mktemp("reference")
        done = mpiexec(2, "--storage", str(storage), "--epochs", str(EPOCHS), script=SHARDED,
                       timeout=120)
        shards: list[str] = json.loads(done.line("FINAL") or "null")["shards"]
        return shards

    return computed_once(tmp_path_factory, "lock-fence-shards", compute)


def frozen_run_is_fenced(view: LocalView, log: Path, reference: list[str]) -> None:
    a = start_frozen_candidate(view, log)
    try:
        wait_until(lambda: committed(view), "run A's first commit", process=a, log=log)
        # Right after a commit: the next write (step 1's metrics line) is an epoch away.
        signal_run(a.pid, signal.SIGSTOP)
        wait_until(lambda: run_stopped(a.pid), "run A stopped", timeout=20, log=log)
        frozen = json.loads(view.read("manifest.json") or b"{}")
        wait_until(lambda: stale(view), "run A's lock stale", timeout=30, log=log)
        b = mpiexec(2, "--storage", view.storage, *ARGS, script=SHARDED, timeout=180,
                    env={"HPCKIT_LOCK_STALE_SECONDS": f"{STALE:g}", "HPCKIT_RUN_ID": "run-B"})
        assert json.loads(b.line("FINAL") or "null")["shards"] == reference, b.output
        left = {name: view.read(name) for name in ("manifest.json", "metrics.jsonl")}
        names = view.names()
        signal_run(a.pid, signal.SIGCONT)
        try:
            a.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run A did not end after it woke:\n{log.read_text()}")
    finally:
        if a.poll() is None:
            signal_run(a.pid, signal.SIGKILL)
            a.wait()
    output = log.read_text()
    assert a.returncode == exits.TAKEN, f"run A exited {a.returncode}:\n{output}"
    # One error, raised on every rank at A's next report, naming run B (from the manifest:
    # B ended and removed its lock before A woke).
    raised = re.findall(r"\[(\d)\] RAISED (\w+): (.*?)(?=\[\d\] |$)", output, re.MULTILINE)
    assert {rank for rank, _, _ in raised} == {"0", "1"}, output
    assert {name for _, name, _ in raised} == {"ExperimentTakenError"}, output
    assert output.count("hpckit: error:") == 1, output
    final = json.loads(left["manifest.json"] or b"{}")
    runner_b = final["attempts"][-1]
    assert f"host {runner_b['host']}, pid {runner_b['pid']}" in output, output
    # A wrote nothing after it woke: the experiment is as B left it, lock included.
    assert {name: view.read(name) for name in left} == left
    assert view.names() == names and LOCK_NAME not in names
    assert [(t["pid"], t["started_at"]) for t in final["attempts"]] == [
        (t["pid"], t["started_at"]) for t in frozen["attempts"]] + [
        (runner_b["pid"], runner_b["started_at"])]
    assert runner_b["status"] == "finished"
    steps = [json.loads(line)["step"] for line in (left["metrics.jsonl"] or b"").splitlines()]
    assert steps == list(range(EPOCHS)), steps
    run([HPCKIT, "verify", view.experiment], timeout=60)


def test_a_frozen_run_whose_experiment_was_taken_over_writes_nothing_more(tmp_path, reference):
    frozen_run_is_fenced(LocalView(tmp_path), tmp_path / "a.log", reference)


def test_a_frozen_run_is_fenced_on_s3(s3, tmp_path, reference):
    frozen_run_is_fenced(S3View(s3, f"fence-{tmp_path.name}"), tmp_path / "a.log", reference)


@pytest.mark.parametrize(("launcher", "mode"), [
    ("mpiexec", "sync"), ("hpckit run", "sync"), ("python", "sync"),
    ("mpiexec", "async"), ("hpckit run", "async"), ("python", "async")])
def test_a_run_woken_while_the_other_still_trains_names_it_in_one_error(tmp_path, reference,
                                                                         launcher, mode):
    """#51 item 14: run A wakes while run B, which took its experiment over, is still
    training (B's lock is there and fresh): A fails on every rank with one ``hpckit: error:``
    line naming B, exits 77, and B ends as an uninterrupted run. ASYNC: A's commit under way
    in the background meets the fence. #65: under mpiexec rank 0 says the line before the
    ranks leave together, since mpiexec ends the ranks still running when the first exits."""
    view, log = LocalView(tmp_path), tmp_path / "a.log"
    prefix = {"mpiexec": None, "hpckit run": [HPCKIT, "run", "-n", "2"],
              "python": [sys.executable]}[launcher]  # python train.py: hpckit starts 2 ranks
    a = start_frozen_candidate(view, log, prefix, ("--mode", mode, "--workers", "2"))
    b = None
    try:
        wait_until(lambda: committed(view), "run A's first commit", process=a, log=log)
        signal_run(a.pid, signal.SIGSTOP)
        wait_until(lambda: run_stopped(a.pid), "run A stopped", timeout=20, log=log)
        wait_until(lambda: stale(view), "run A's lock stale", timeout=30, log=log)
        b_log = tmp_path / "b.log"
        with open(b_log, "w") as out:  # slower epochs: B trains on long after A wakes
            b = subprocess.Popen(
                [MPIEXEC, "-n", "2", sys.executable, str(SHARDED), "--storage", view.storage,
                 "--epochs", str(EPOCHS), "--epoch-seconds", "1.5"], stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "HPCKIT_RUN_ID": "run-B",
                     "HPCKIT_LOCK_STALE_SECONDS": f"{STALE:g}"})
        holder = wait_until(lambda: (h := parsed(view, LOCK_NAME)) and h["run_id"] == "run-B"
                            and Holder(**h), "run B's lock", process=b, log=b_log)
        signal_run(a.pid, signal.SIGCONT)
        a.wait(timeout=120)
        assert b.poll() is None, "run B ended before run A woke:\n" + b_log.read_text()
        b.wait(timeout=180)
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                signal_run(process.pid, signal.SIGKILL)
                process.wait()
    output = log.read_text()
    assert a.returncode == exits.TAKEN, f"run A exited {a.returncode}:\n{output}"
    errors = [line for line in output.splitlines() if "hpckit: error:" in line]
    assert len(errors) == 1 and f"host {holder.host}, pid {holder.pid}" in errors[0], output
    assert b.returncode == 0, b_log.read_text()
    done = re.search(r"FINAL (\{.*\})", b_log.read_text())
    assert done and json.loads(done.group(1))["shards"] == reference, b_log.read_text()


@pytest.mark.parametrize(("status", "attempts"), [(exits.TAKEN, 1), (1, 2)])
def test_hpckit_run_never_restarts_a_run_whose_experiment_was_taken(tmp_path, status, attempts):
    """``hpckit run --max-failures 1`` restarts a failed script once, but not one that exited
    77: its experiment is another run's."""
    script = tmp_path / "ends.py"
    script.write_text(f"import sys\nopen({str(tmp_path / 'started')!r}, 'a').write('x')\n"
                      f"sys.exit({status})\n")
    done = run([HPCKIT, "run", "-n", "1", "--max-failures", "1", str(script)], timeout=60,
               expect=status)
    assert (tmp_path / "started").read_text() == "x" * attempts, done.output


TAKEN_MID_RUN = """
import json, os, sys, time
import hpckit
from hpckit import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

def train(config):
    ctx = hpckit.get_context()
    if ctx.get_world_rank() == 0:
        open(config["started"], "a").write("x")
    hpckit.report({"n": 0})
    if ctx.get_world_rank() == 0:  # another run takes the experiment's lock over
        # once step 0's line is written: the writer thread writes it after report() returns,
        # and a line it has not written when the lock changes hands is never written
        metrics = os.path.join(ctx.get_experiment_path(), "metrics.jsonl")
        deadline = time.monotonic() + 60
        while not (os.path.exists(metrics) and open(metrics).read().endswith("\\n")):
            assert time.monotonic() < deadline, "step 0's metrics line never came"
            time.sleep(0.01)
        lock = os.path.join(ctx.get_experiment_path(), ".hpckit-lock.json")
        with open(lock + ".theirs", "w") as f:
            f.write(config["theirs"])
        os.replace(lock + ".theirs", lock)  # whole, as a lock is written
    hpckit.report({"n": 1})

if __name__ == "__main__":
    DataParallelTrainer(train, train_loop_config=json.loads(sys.argv[2]),
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(name="e", storage_path=sys.argv[1],
                                             failure_config=FailureConfig(max_failures=2))).fit()
"""


def test_python_train_py_never_restarts_ranks_whose_experiment_was_taken(tmp_path):
    """``python train.py`` starts its ranks itself and restarts them after a failure, as
    FailureConfig allows; not after the ranks' experiment was taken: they exit 77, and so does
    the program, with the error naming the other run, and the other run's lock stays."""
    script = tmp_path / "train.py"
    script.write_text(TAKEN_MID_RUN)
    theirs = json.dumps({"token": "0" * 32, "host": "node-elsewhere", "pid": 1, "job_id": "77",
                         "run_id": "run-B", "started_at": time.time(),
                         "refreshed_at": time.time() + 3600})
    config = {"started": str(tmp_path / "started"), "theirs": theirs}
    done = run([sys.executable, str(script), str(tmp_path), json.dumps(config)], timeout=120,
               expect=exits.TAKEN)
    assert (tmp_path / "started").read_text() == "x", done.output  # one attempt
    assert "was taken over by another run (host node-elsewhere" in done.output, done.output
    assert (tmp_path / "e" / LOCK_NAME).read_text() == theirs
    lines = (tmp_path / "e" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0], lines  # nothing after
