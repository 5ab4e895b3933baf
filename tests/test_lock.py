"""One writer per experiment: a second run fails fast naming the holder; a dead run's lock
is recognised as stale and taken over, with a warning."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import HERE, MPIEXEC, mpiexec

from hpckit import ExperimentLockedError
from hpckit.experiment.lock import FENCE_PREFIX, LOCK_NAME, Lock
from hpckit.settings import Settings
from hpckit.storage.location import resolve

pytestmark = pytest.mark.quick

SHARDED = HERE / "ranks" / "sharded.py"


def start_slow_run(storage, env: dict[str, str]) -> subprocess.Popen:
    command = [MPIEXEC, "-n", "2", sys.executable, str(SHARDED), "--storage", str(storage),
               "--epochs", "400", "--epoch-seconds", "0.02"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **env})


def wait_for_lock(path, process: subprocess.Popen) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())
        if process.poll() is not None:
            pytest.fail(f"the first run ended before it locked:\n{process.communicate()[0]}")
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"no lock after 30 s:\n{process.communicate()[0]}")


@pytest.mark.alone  # it times the failure
def test_a_second_run_fails_fast_naming_the_holder(tmp_path):
    first = start_slow_run(tmp_path, {"SLURM_JOB_ID": "4242"})
    try:
        holder = wait_for_lock(tmp_path / "exp" / LOCK_NAME, first)
        started = time.monotonic()
        second = mpiexec(2, "--storage", str(tmp_path), "--epochs", "3", script=SHARDED,
                         expect=None, timeout=60)
        assert second.returncode != 0
        assert time.monotonic() - started < 15, "the second run did not fail fast"
        text = re.sub(r"\[\d+\] ", "", second.output)
        assert "ExperimentLockedError" in text and "is in use by another run" in text, text
        assert f"host {holder['host']}, pid {holder['pid']}, Slurm job 4242" in text, text
        assert first.poll() is None, "the first run was disturbed"
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=60)


def test_a_killed_runs_lock_is_taken_over_with_a_warning(tmp_path):
    first = start_slow_run(tmp_path, {})
    holder = wait_for_lock(tmp_path / "exp" / LOCK_NAME, first)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    assert (tmp_path / "exp" / LOCK_NAME).exists(), "a SIGKILLed run cannot remove its lock"
    second = mpiexec(2, "--storage", str(tmp_path), "--epochs", "3", script=SHARDED, timeout=90)
    text = re.sub(r"\[\d+\] ", "", second.output)
    assert re.search(rf"taking over the stale lock of host \S+, pid {holder['pid']}.*"
                     rf"pid {holder['pid']} no longer runs", text), text
    assert not (tmp_path / "exp" / LOCK_NAME).exists(), "a finished run leaves its lock behind"


def write_lock(experiment, host: str, refreshed_ago: float) -> None:
    experiment.mkdir(parents=True, exist_ok=True)
    now = time.time()
    (experiment / LOCK_NAME).write_text(json.dumps({
        "token": "0" * 32, "host": host, "pid": 1, "job_id": "77", "run_id": None,
        "started_at": now - 3600, "refreshed_at": now - refreshed_ago}))


def test_a_lock_from_another_host_is_stale_only_once_it_stops_being_refreshed(tmp_path, caplog):
    experiment = tmp_path / "exp"
    env = Settings.read({"HPCKIT_LOCK_STALE_SECONDS": "60"})
    write_lock(experiment, "node-elsewhere", refreshed_ago=5)
    with pytest.raises(ExperimentLockedError, match="host node-elsewhere, pid 1, Slurm job 77"):
        Lock.acquire(resolve(str(experiment)), env)
    write_lock(experiment, "node-elsewhere", refreshed_ago=120)
    lock = Lock.acquire(resolve(str(experiment)), env)
    assert "not refreshed for 120 s" in caplog.text
    assert json.loads((experiment / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (experiment / LOCK_NAME).exists()


def test_the_lock_is_refreshed_while_held_and_a_later_attempt_of_the_run_takes_it(tmp_path):
    experiment = resolve(str(tmp_path / "exp"))
    os.makedirs(experiment.path)
    env = Settings.read({"HPCKIT_LOCK_STALE_SECONDS": "5", "HPCKIT_RUN_ID": "run-1"})
    lock = Lock.acquire(experiment, env)
    first = json.loads((tmp_path / "exp" / LOCK_NAME).read_text())["refreshed_at"]
    deadline = time.monotonic() + 10  # it refreshes every 1 s (a fifth of 5 s)
    while json.loads((tmp_path / "exp" / LOCK_NAME).read_text())["refreshed_at"] == first:
        assert time.monotonic() < deadline, "the holder did not refresh its lock"
        time.sleep(0.05)
    successor = Lock.acquire(experiment, env)  # same run id: its own earlier attempt
    lock.release()  # the earlier attempt no longer owns it, so it must not remove it
    assert (tmp_path / "exp" / LOCK_NAME).exists()
    successor.release()


@pytest.mark.parametrize("value", ["0", "soon", "-5"])
def test_a_bad_stale_time_is_refused(tmp_path, value):
    from hpckit.errors import ConfigError

    with pytest.raises(ConfigError, match=f"HPCKIT_LOCK_STALE_SECONDS={value!r}"):
        Lock.acquire(resolve(str(tmp_path)), Settings.read({"HPCKIT_LOCK_STALE_SECONDS": value}))


def test_gc_refuses_an_experiment_a_live_run_holds(tmp_path):
    from click.testing import CliRunner

    from hpckit import DataParallelTrainer, RunConfig
    from hpckit.cli import main

    DataParallelTrainer(lambda: None, run_config=RunConfig(name="exp", storage_path=str(tmp_path))).fit()
    write_lock(tmp_path / "exp", "node-elsewhere", refreshed_ago=1)
    refused = CliRunner().invoke(main, ["gc", "--keep", "1", str(tmp_path / "exp")])
    assert refused.exit_code != 0 and "in use by a run (host node-elsewhere, pid 1, Slurm job 77" \
        in refused.output, refused.output
    assert CliRunner().invoke(main, ["gc", "--keep", "1", "--force", str(tmp_path / "exp")]).exit_code == 0


def test_a_take_over_replaces_only_the_stale_lock_it_read_and_the_loser_names_the_winner(
        tmp_path, monkeypatch):
    """#51, item 10: two runs took over one stale lock, the second a moment later; it moved
    the first's fresh lock aside as if it were the stale one, and both "won"."""
    from hpckit.experiment import lock as lock_module
    from hpckit.storage.location import local

    experiment = tmp_path / "exp"
    write_lock(experiment, "elsewhere", refreshed_ago=10_000)
    take = lock_module._take
    first: list[Lock] = []
    meanwhile: list[bool] = []

    def the_first_run_takes_it_meanwhile(location, me, *stale):  # type: ignore[no-untyped-def]
        if not meanwhile:  # the second run's take-over: the first run's happens before it
            meanwhile.append(True)
            first.append(Lock.acquire(local(str(experiment)), Settings()))
        take(location, me, *stale)

    monkeypatch.setattr(lock_module, "_take", the_first_run_takes_it_meanwhile)
    try:
        with pytest.raises(ExperimentLockedError) as refused:
            Lock.acquire(local(str(experiment)), Settings())
        winner = first[0].holder
        assert f"locked by host {winner.host}, pid {winner.pid}" in str(refused.value)
        assert json.loads((experiment / LOCK_NAME).read_text())["token"] == winner.token
        # Nothing of the loser's is left: the winner's lock and its fence directory.
        assert sorted(p.name for p in experiment.iterdir()) == [
            FENCE_PREFIX + winner.token, LOCK_NAME]
    finally:
        for held in first:
            held.release()
