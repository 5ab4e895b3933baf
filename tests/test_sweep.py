"""Sweeps (hpckit.tune): search spaces, the sweep manifest, trials as ordinary experiments,
a failing trial beside finished ones, and a sweep killed mid-trial that resumes."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, MPIEXEC, manifest, metrics_lines, run

from hpckit import tune
from hpckit.errors import ConfigError
from hpckit.sweep import trialqueue
from hpckit.sweep.space import expand

SWEEP = HERE / "ranks" / "sweep.py"


def test_grids_multiply_samples_repeat_them_and_the_seed_fixes_the_draws():
    space = {"a": tune.grid_search([1, 2]), "b": tune.grid_search(["x", "y"]),
             "opt": {"lr": tune.loguniform(1e-4, 1e-1), "n": tune.randint(1, 3)}, "c": 5}
    trials = expand(space, num_samples=2, seed=11)
    assert [(t["a"], t["b"]) for t in trials] == [(1, "x"), (1, "y"), (2, "x"), (2, "y")] * 2
    assert all(1e-4 <= t["opt"]["lr"] < 1e-1 and t["opt"]["n"] in (1, 2) and t["c"] == 5
               for t in trials)
    assert len({t["opt"]["lr"] for t in trials}) == 8  # a fresh draw per trial
    assert expand(space, 2, 11) == trials and expand(space, 2, 12) != trials


@pytest.mark.parametrize("make, fragment", [
    (lambda: tune.grid_search([]), "non-empty list"),
    (lambda: tune.choice("abc"), "non-empty list"),
    (lambda: tune.uniform(1, 1), "lower < upper"),
    (lambda: tune.loguniform(0, 1), "0 < lower"),
    (lambda: tune.randint(0.5, 3), "integers"),
    (lambda: expand([1, 2], 1, 0), "must be a dict"),
    (lambda: tune.TuneConfig(metric="loss"), "metric and mode together"),
    (lambda: tune.TuneConfig(num_samples=0), "num_samples=0"),
    (lambda: tune.TuneConfig(mode="best", metric="x"), "'max'"),
    (lambda: tune.Tuner(42), "training function"),
    (lambda: tune.RunConfig(stop={"loss": "low"}), "dict of metric names to thresholds"),
    (lambda: trialqueue.check(2, 4), r"2 ranks cannot be split into trials of 4.*mpirun -n 4"),
])
def test_bad_search_spaces_and_configs_say_what_would_be_right(make, fragment):
    with pytest.raises(ConfigError, match=fragment):
        make()


def test_a_search_space_object_of_another_library_is_refused_by_name():
    class Float:  # as ray.tune.search.sample.Float is named
        pass

    with pytest.raises(ConfigError, match=r"\['lr'\].*cannot sample"):
        expand({"lr": Float()}, 1, 0)


def _sweep(tmp_path: Path, *args: str, launcher: list[str] | None = None, expect: int = 0):
    command = [*(launcher or []), sys.executable, str(SWEEP), "--storage", str(tmp_path), *args]
    return run(command, timeout=180, expect=expect)


def _grid(output: str) -> dict:
    return json.loads(next(line for line in output.splitlines() if line.startswith("GRID "))[5:])


def test_a_failing_trial_leaves_the_others_finished_each_an_ordinary_experiment(tmp_path):
    done = _sweep(tmp_path, "--fail-lr", "0.2")
    grid = _grid(done.output)
    assert (grid["terminated"], grid["errors"], grid["best"]) == (2, 1, 0.3), done.output
    sweep = json.loads((tmp_path / "grid" / "sweep.json").read_text())
    names = [t["dirname"] for t in sweep["trials"]]
    assert [n.split(",")[0] for n in names] == [
        "trial_00000_lr=0.1", "trial_00001_lr=0.2", "trial_00002_lr=0.3"]
    assert [t["status"] for t in sweep["trials"]] == ["TERMINATED", "ERROR", "TERMINATED"]
    assert "ValueError: lr 0.2 diverged" in sweep["trials"][1]["error"]
    assert [c["lr"] for c in grid["configs"]] == [0.1, 0.2, 0.3]
    for trial in sweep["trials"]:
        body = manifest(tmp_path / "grid" / trial["dirname"])
        assert len(body["checkpoints"]) == (2 if trial["status"] == "TERMINATED" else 1)
    listed = run([HPCKIT, "ls", str(tmp_path / "grid" / names[0])], timeout=60)
    assert "checkpoint_000002" in listed.output
    table = run([HPCKIT, "ls", str(tmp_path / "grid")], timeout=60).output.splitlines()
    assert table[0].split()[:4] == ["TRIAL", "STATUS", "lr", "shift"], table  # what varies
    assert [line.split()[1] for line in table[1:4]] == ["finished", "failed", "finished"]
    assert table[-1] == "3 trial(s): 2 finished, 1 failed"
    plotted = run([HPCKIT, "plot", str(tmp_path / "grid"), "--metric", "score", "-o",
                   str(tmp_path / "grid.png")], timeout=60)
    assert (tmp_path / "grid.png").stat().st_size > 0, plotted.output
    again = _sweep(tmp_path, "--fail-lr", "0.2")  # nothing left to run: the same grid back
    assert _grid(again.output) == grid and "trial trial_" not in again.output


def test_a_sweep_killed_mid_trial_resumes_that_trial_from_its_own_checkpoint(tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(SWEEP), "--storage", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HOLD_LR": "0.2"})
    held = tmp_path / "grid"
    deadline = time.monotonic() + 120
    while not any(t["status"] == "RUNNING" and t["index"] == 1 for t in _trials(held)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.2)
    second = held / _trials(held)[1]["dirname"]
    while not (second / "metrics.jsonl").exists() or not metrics_lines(second):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    output = process.communicate()[0]
    assert [t["status"] for t in _trials(held)] == ["TERMINATED", "RUNNING", "PENDING"], output
    done = _sweep(tmp_path)
    grid = _grid(done.output)
    assert (grid["terminated"], grid["errors"]) == (3, 0), done.output
    assert [m["step"] for m in metrics_lines(second)] == [0, 1, 2]  # resumed, not restarted
    assert [a["status"] for a in manifest(second)["attempts"]][-1] == "finished"
    first = held / _trials(held)[0]["dirname"]
    assert len(manifest(first)["attempts"]) == 1, done.output  # finished before: not rerun


def _trials(sweep: Path) -> list[dict]:
    try:
        return json.loads((sweep / "sweep.json").read_text())["trials"]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_under_mpiexec_trials_are_packed_into_groups_each_trial_run_once(tmp_path):
    done = _sweep(tmp_path, "--ranks", "2", "--samples", "2", launcher=[MPIEXEC, "-n", "4"])
    grid = _grid(done.output)
    assert grid["terminated"] == 6, done.output
    assert {m["ranks"] for m in grid["metrics"]} == {2}  # each on a group of two ranks
    assert {m["leader"] for m in grid["metrics"]} == {0, 2}, done.output  # both groups took some
    for trial in _trials(tmp_path / "grid"):
        attempts = manifest(tmp_path / "grid" / trial["dirname"])["attempts"]
        assert [a["status"] for a in attempts] == ["finished"], trial  # exactly once
    assert [t["status"] for t in _trials(tmp_path / "grid")] == ["TERMINATED"] * 6
    failing = _sweep(tmp_path / "failing", "--fail-lr", "0.2", "--max-failures", "1",
                     launcher=[MPIEXEC, "-n", "3"])  # three 1-rank groups
    assert (_grid(failing.output)["terminated"], _grid(failing.output)["errors"]) == (2, 1)
    failed = _trials(tmp_path / "failing" / "grid")[1]
    attempts = manifest(tmp_path / "failing" / "grid" / failed["dirname"])["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "failed"], failing.output  # retried
    refused = _sweep(tmp_path / "odd", "--ranks", "2", launcher=[MPIEXEC, "-n", "3"], expect=1)
    assert "3 ranks cannot be split into trials of 2 rank(s)" in refused.output, refused.output
    assert not (tmp_path / "odd").exists()  # refused before anything was written


def _committed_lines(experiment: Path) -> list[dict]:
    """The metrics lines up to the latest committed checkpoint: a line written just before a
    kill stopped its checkpoint's commit is dropped by the resume, by design."""
    latest = max((c["step"] for c in manifest(experiment)["checkpoints"]), default=-1) \
        if (experiment / "manifest.json").exists() else -1
    return [line for line in metrics_lines(experiment) if line["step"] <= latest]


def test_a_rank_killed_mid_sweep_loses_nothing_and_the_rerun_finishes_every_trial(tmp_path):
    """4 ranks, 2-rank trials, 6 trials; the trials with lr 0.2 hold at their second step
    and one of their ranks is SIGKILLed (mpiexec then ends the others)."""
    log = tmp_path / "out.txt"
    with log.open("w") as out:
        process = subprocess.Popen(
            [MPIEXEC, "-n", "4", sys.executable, str(SWEEP), "--storage", str(tmp_path),
             "--ranks", "2", "--samples", "2"], stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "HOLD_LR": "0.2"})
    deadline = time.monotonic() + 120
    while "HOLDING pid" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    pid = int(log.read_text().split("HOLDING pid ")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the sweep went on after a rank was killed:\n{log.read_text()}")
    before = {t["dirname"]: _committed_lines(tmp_path / "grid" / t["dirname"])
              for t in _trials(tmp_path / "grid")
              if (tmp_path / "grid" / t["dirname"] / "metrics.jsonl").exists()}
    done = _sweep(tmp_path, "--ranks", "2", "--samples", "2", launcher=[MPIEXEC, "-n", "4"])
    assert _grid(done.output)["terminated"] == 6, done.output
    for trial in _trials(tmp_path / "grid"):
        steps = [m["step"] for m in metrics_lines(tmp_path / "grid" / trial["dirname"])]
        assert steps == [0, 1, 2], (trial, steps)  # nothing committed was redone or lost
        kept = before.get(trial["dirname"], [])
        assert metrics_lines(tmp_path / "grid" / trial["dirname"])[:len(kept)] == kept


def test_the_sweep_example_packs_two_trials_at_a_time_and_resumes_after_a_kill(tmp_path):
    """examples/sweep_fashion.py on 4 ranks: 4 trials of 2 ranks, 2 at a time. Killed once
    the first checkpoints are in, and run again, every trial finishes with each epoch once."""
    command = [MPIEXEC, "-n", "4", sys.executable, str(HERE.parent / "examples" / "sweep_fashion.py"),
               "--storage", str(tmp_path), "--data", str(tmp_path / "fashion.h5"),
               "--train-size", "600", "--epochs", "2",
               "--loader-workers", "0"]  # the loader's processes are not what it tests
    sweep = tmp_path / "sweep-fashion"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while not any((sweep / t["dirname"] / "metrics.jsonl").exists() for t in _trials(sweep)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    done = run(command, timeout=300)
    assert "4 of 4 trials finished" in done.output, done.output
    trials = _trials(sweep)
    assert sorted((t["config"]["lr"], t["config"]["batch_size"]) for t in trials) == [
        (1e-3, 32), (1e-3, 128), (3e-3, 32), (3e-3, 128)]
    for trial in trials:
        experiment = sweep / trial["dirname"]
        assert [m["metrics"]["epoch"] for m in metrics_lines(experiment)] == [0, 1], trial
        assert manifest(experiment)["world_size"] == 2
        assert manifest(experiment)["retention"]["checkpoint_score_attribute"] == "accuracy"


def test_a_stop_criterion_ends_each_trial_early_as_finished(tmp_path):
    """RunConfig(stop=...), as Ray Tune's: two reports per trial, or a score reached."""
    done = _sweep(tmp_path / "a", "--stop", '{"training_iteration": 2}',
                  launcher=[MPIEXEC, "-n", "3"])
    assert _grid(done.output)["terminated"] == 3, done.output
    for trial in _trials(tmp_path / "a" / "grid"):
        experiment = tmp_path / "a" / "grid" / trial["dirname"]
        assert [m["step"] for m in metrics_lines(experiment)] == [0, 1], trial
        assert [a["status"] for a in manifest(experiment)["attempts"]] == ["finished"]
        assert manifest(experiment)["latest"] == "checkpoint_000001"  # its checkpoint kept
    done = _sweep(tmp_path / "b", "--stop", '{"score": 0.9}')  # scores: lr * (step+1) + shift
    for trial in _trials(tmp_path / "b" / "grid"):
        scores = [m["metrics"]["score"] for m in metrics_lines(tmp_path / "b" / "grid" / trial["dirname"])]
        assert all(s < 0.9 for s in scores[:-1]) and (scores[-1] >= 0.9 or len(scores) == 3)


def _read_until(fd: int, process: subprocess.Popen, done, timeout: float) -> str:
    """What the process wrote to its terminal, until ``done(what was written)``."""
    seen = ""
    deadline = time.monotonic() + timeout
    while not done(seen):
        assert process.poll() is None and time.monotonic() < deadline, seen
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            seen += os.read(fd, 65536).decode(errors="replace").replace("\r\n", "\n")
    return seen


def test_the_live_table_shows_on_a_terminal_and_plain_lines_otherwise(tmp_path):
    """On a terminal rank 0 prints Tune's progress table when the trials change: here one
    finished, one held mid-run and one waiting. Without a terminal, one line per trial."""
    main, child = pty.openpty()
    process = subprocess.Popen([sys.executable, str(SWEEP), "--storage", str(tmp_path)],
                               stdin=child, stdout=child, stderr=child, start_new_session=True,
                               env={**os.environ, "HOLD_LR": "0.2"})
    os.close(child)
    try:
        lead = "1 finished, 1 running, 1 pending"
        shown = _read_until(main, process,  # the table's first line, its header and 3 rows
                            lambda seen: lead in seen and seen.split(lead)[-1].count("\n") >= 5, 60)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        os.close(main)
    table = shown[shown.rindex("== Sweep grid: 3 trial(s)"):].splitlines()
    assert table[1].split() == ["TRIAL", "STATUS", "lr", "shift", "REPORTS", "score", "best",
                                "score"], shown
    rows = {line.split()[0]: line.split() for line in table[2:5]}
    finished = rows[next(name for name in rows if name.startswith("trial_00000"))]
    assert finished[1:2] + finished[4:5] == ["finished", "3"], table
    assert rows[next(name for name in rows if name.startswith("trial_00001"))][1] == "running"
    assert "| best score=" in table[0], table
    done = _sweep(tmp_path)  # a pipe, not a terminal: no table, a line as each trial ends
    assert "== Sweep" not in done.output, done.output
    assert done.output.count(" finished: {") == 2, done.output  # trial 0 had finished before


def test_under_python_max_concurrent_trials_starts_ranks_that_take_the_trials(tmp_path):
    """`python sweep.py` with max_concurrent_trials=3: hpckit starts 3 ranks, each a group
    that takes trials from the queue; a failing trial is recorded beside the others, and a
    rerun has nothing to run."""
    done = run([sys.executable, str(SWEEP), "--storage", str(tmp_path), "--concurrent", "3",
                "--fail-lr", "0.2"], timeout=180, env={"STEP_SECONDS": "0.5"})
    assert "starting 3 rank(s) for the sweep's trials" in done.output, done.output
    grid = _grid(done.output)
    assert (grid["terminated"], grid["errors"]) == (2, 1), done.output
    assert sorted(m["leader"] for m in grid["metrics"] if m) != [0, 0], done.output  # in parallel
    assert done.output.count("GRID ") == 1, done.output  # the ranks returned to no script
    again = _sweep(tmp_path, "--concurrent", "3", "--fail-lr", "0.2")
    assert "3 trial(s), 0 to run" in again.output and "starting" not in again.output


def test_ctrl_c_stops_every_trial_that_python_started_and_the_rerun_resumes_them(tmp_path):
    """Ctrl-C to `python sweep.py` with 3 ranks of its own, while every trial runs: each
    trial records `interrupted` with what it committed, nothing prints a traceback or MPI's
    banner, and the rerun resumes each trial without redoing a committed step."""
    command = [sys.executable, str(SWEEP), "--storage", str(tmp_path), "--concurrent", "3"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", "STEP_SECONDS": "1"})
    sweep = tmp_path / "grid"
    deadline = time.monotonic() + 120
    while sum((sweep / t["dirname"] / "metrics.jsonl").exists() for t in _trials(sweep)) < 3:
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    try:
        output = process.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"still running 60 s after Ctrl-C:\n{process.communicate()[0]}")
    assert process.returncode in (130, -signal.SIGINT), output
    assert "Traceback" not in output and "BAD TERMINATION" not in output, output
    assert "sweep interrupted" in output, output
    before = {}
    for trial in _trials(sweep):
        experiment = sweep / trial["dirname"]
        assert [a["status"] for a in manifest(experiment)["attempts"]] == ["interrupted"], output
        before[trial["dirname"]] = metrics_lines(experiment)
    again = _sweep(tmp_path, "--concurrent", "3")
    assert _grid(again.output)["terminated"] == 3, again.output
    for trial in _trials(sweep):
        experiment = sweep / trial["dirname"]
        assert [m["step"] for m in metrics_lines(experiment)] == [0, 1, 2], trial
        kept = before[trial["dirname"]]
        assert metrics_lines(experiment)[:len(kept)] == kept


TAKEN_TRIAL = """
import json, os, sys, time
import hpckit
from hpckit import tune

THEIRS = sys.argv[2]

def train(config):
    tune.report({"score": config["x"]})
    if config["x"] == 2:  # another process takes this trial's experiment over
        lock = os.path.join(tune.get_context().get_experiment_path(), ".hpckit-lock.json")
        with open(lock + ".theirs", "w") as f:
            f.write(THEIRS)
        os.replace(lock + ".theirs", lock)  # whole, as a lock is written
    tune.report({"score": config["x"] + 1})

grid = tune.Tuner(train, param_space={"x": tune.grid_search([1, 2, 3])},
                  tune_config=tune.TuneConfig(metric="score", mode="max"),
                  run_config=hpckit.RunConfig(
                      name="sw", storage_path=sys.argv[1],
                      failure_config=hpckit.FailureConfig(max_failures=2))).fit()
print("GRID", grid.num_errors, grid.num_terminated, flush=True)
"""


def test_a_trial_whose_experiment_was_taken_errors_once_and_the_sweep_goes_on(tmp_path):
    """FailureConfig retries a failed trial, but not one whose experiment another process
    took over (exit status 77 for a run): that trial errors at once, its lock left to the
    other, and the other trials run."""
    script = tmp_path / "sweep.py"
    script.write_text(TAKEN_TRIAL)
    theirs = json.dumps({"token": "0" * 32, "host": "node-elsewhere", "pid": 1, "job_id": None,
                         "run_id": "run-B", "started_at": time.time(),
                         "refreshed_at": time.time() + 3600})
    done = run([sys.executable, str(script), str(tmp_path), theirs], timeout=120)
    assert done.line("GRID") == "1 2", done.output
    taken = next((tmp_path / "sw").glob("trial_00001_*"))
    assert len(manifest(taken)["attempts"]) == 1, done.output  # not retried
    assert (taken / ".hpckit-lock.json").read_text() == theirs
    assert "was taken over by another run (host node-elsewhere" in done.output, done.output


RETRIED_GROUP = """
import os, sys, tempfile
import hpckit
from hpckit import tune
from hpckit.run.mpi.comm import live_backgrounds

def upload(checkpoint, name):
    ctx = tune.get_context()
    if ctx.get_world_rank() == 1 and ctx.get_attempt() < 3:
        raise OSError("the upload failed on purpose")
    target = os.path.join(ctx.get_experiment_path(), name)
    os.makedirs(target, exist_ok=True)
    open(os.path.join(target, f"rank-{ctx.get_world_rank()}"), "w").write("x")
    return hpckit.Checkpoint(target)

def train(config):
    for step in range(3):  # the failed upload is raised at the next report, on every rank
        hpckit.report({"score": step},
                      checkpoint=hpckit.Checkpoint.from_directory(tempfile.mkdtemp()),
                      checkpoint_upload_fn=upload, checkpoint_upload_mode="async")

trainer = hpckit.DataParallelTrainer(train, scaling_config=hpckit.ScalingConfig(num_workers=2))
grid = tune.Tuner(trainer, param_space={"x": 1},
                  tune_config=tune.TuneConfig(metric="score", mode="max"),
                  run_config=hpckit.RunConfig(
                      name="sw", storage_path=sys.argv[1],
                      failure_config=hpckit.FailureConfig(max_failures=3))).fit()
print(f"LIVE {os.environ['PMI_RANK']} {live_backgrounds()} {grid.num_terminated}", flush=True)
"""


def test_a_group_retried_in_process_frees_each_failed_attempts_background_communicator(
        tmp_path):
    """A trial's two ranks fail together three times (a background upload that failed on
    one rank, raised on both at the next report), and the group restarts in-process: each
    attempt duplicates the communicator for its background meetings, and a failed attempt's
    duplicate is freed when the next attempt makes its own, not left behind per attempt."""
    script = tmp_path / "sweep.py"
    script.write_text(RETRIED_GROUP)
    done = run([MPIEXEC, "-n", "2", sys.executable, str(script), str(tmp_path)], timeout=180,
               cwd=tmp_path)
    # mpiexec may put the two ranks' lines on one line of its output: read every LIVE record.
    live = sorted(list(found) for found in re.findall(r"LIVE (\d+) (\d+) (\d+)", done.output))
    assert live == [["0", "0", "1"], ["1", "0", "1"]], done.output
    trial = next((tmp_path / "sw").glob("trial_*"))
    assert [a["status"] for a in manifest(trial)["attempts"]] == ["failed"] * 3 + ["finished"]
