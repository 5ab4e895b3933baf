"""Tune's schedulers and search algorithms on hpckit's sweeps, as Ray's own examples use them
(tests/seeds/tune_*.py, only their imports changed), run as ``python sweep.py``: ASHA stops
poor trials early, HyperBand's paused trials resume bit-identical, PBT exploits and beats
the same population without it, Optuna finds a known optimum behind a ConcurrencyLimiter, a
sweep driver killed mid-search continues the same search, and a kill in a pause's or an
exploit's checkpoint loses nothing."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, MPIEXEC, manifest, run
from support.once import computed_once
from support.slurm_jobs import output_of, sbatch, wait

from hpckit import tune
from hpckit.errors import ConfigError
from hpckit.tune.schedulers import ASHAScheduler, HyperBandScheduler, PopulationBasedTraining
from hpckit.tune.search import ConcurrencyLimiter, Repeater, Searcher

SEEDS = HERE / "seeds"
TIMEOUT = 180


def _program(name: str, storage: Path, *args: str, env: dict[str, str] | None = None,
             expect: int | None = 0):
    return run([sys.executable, str(SEEDS / f"tune_{name}.py"), *args], timeout=TIMEOUT,
               env={"HPCKIT_STORAGE": str(storage), "HPCKIT_TENSORBOARD": "0", **(env or {})},
               expect=expect)


@pytest.fixture
def hyperband_alone(tmp_path_factory) -> list:
    """The HyperBand example's results, its trials one after another: made once a test run."""
    def compute() -> list:
        return _program("hyperband", tmp_path_factory.mktemp("hyperband-alone")).result
    return computed_once(tmp_path_factory, "tune-hyperband-alone", compute)


def _sweep(storage: Path, name: str) -> dict:
    return json.loads((storage / name / "sweep.json").read_text())


def _events(trial: dict, kind: str) -> list[dict]:
    return [e for e in trial["events"] if e["event"] == kind]


def _latest_checksums(experiment: Path) -> list[str]:
    body = manifest(experiment)
    latest = max(body["checkpoints"], key=lambda c: c["index"])
    return sorted(f["checksum"] for f in latest["files"])


def test_asha_stops_poor_trials_early(tmp_path):
    done = _program("asha", tmp_path, "--steps", "20", "--samples", "10")
    iterations = int(done.line("ITERATIONS"))
    assert iterations < 10 * 20, done.output  # fewer than trials x max_t
    sweep = _sweep(tmp_path, "asynchyperband_test")
    stopped = [t for t in sweep["trials"] if _events(t, "stopped")]
    assert stopped and all(t["status"] == "TERMINATED" for t in sweep["trials"])
    assert all(len(manifest(tmp_path / "asynchyperband_test" / t["dirname"])["checkpoints"]) == 0
               for t in stopped)  # the example reports no checkpoint: nothing to keep
    table = run([HPCKIT, "ls", str(tmp_path / "asynchyperband_test")], timeout=60).output
    assert table.splitlines()[0].split()[-1] == "SCHEDULER"
    assert f"{len(stopped)} stopped early" in table.splitlines()[-1], table


def test_hyperband_pauses_trials_at_its_rungs_and_they_resume_bit_identical(tmp_path):
    _program("hyperband", tmp_path)
    reference = _program("hyperband", tmp_path, "--reference").result
    sweep = _sweep(tmp_path, "hyperband_test")
    resumed = [t for t in sweep["trials"] if _events(t, "paused") and not _events(t, "stopped")
               and t["last"].get("training_iteration", 4) == 4 and t["status"] == "TERMINATED"]
    halved = [t for t in resumed if _events(t, "paused")[0]["iteration"] < 4]
    assert halved, sweep  # paused at a rung below max_t, then went on to it
    for trial in halved:
        experiment = tmp_path / "hyperband_test" / trial["dirname"]
        assert len(manifest(experiment)["attempts"]) == 2  # paused, then resumed
        same = tmp_path / "hyperband_reference" / json.loads(
            (tmp_path / "hyperband_reference" / "sweep.json").read_text())["trials"][
            trial["index"]]["dirname"]
        assert _latest_checksums(experiment) == _latest_checksums(same)  # bit-identical
        assert reference[trial["index"]]["iteration"] == 4
    stopped = [t for t in sweep["trials"] if _events(t, "stopped")]
    assert stopped and all(_events(t, "paused") or t["last"] for t in stopped)
    table = run([HPCKIT, "ls", str(tmp_path / "hyperband_test")], timeout=60).output
    assert "paused at 2" in table and "stopped early" in table, table


@pytest.mark.parametrize("placement", ["mpiexec", "spawned"])
def test_hyperband_decides_alike_wherever_its_trials_run(placement, tmp_path, hyperband_alone):
    alone = hyperband_alone
    if placement == "mpiexec":  # packed: two groups, their reports decided on rank 0 by MPI
        env = {"HPCKIT_STORAGE": str(tmp_path / "packed"), "HPCKIT_TENSORBOARD": "0"}
        packed = run([MPIEXEC, "-n", "2", sys.executable, str(SEEDS / "tune_hyperband.py")],
                     timeout=TIMEOUT, env=env)
    else:  # python sweep.py starting two groups of ranks itself
        packed = _program("hyperband", tmp_path / "packed", "--concurrent", "2")
    assert packed.result == alone
    sweep = _sweep(tmp_path / "packed", "hyperband_test")
    assert any(_events(t, "paused") for t in sweep["trials"])


def test_pbt_exploits_and_beats_the_same_population_without_it(tmp_path):
    pbt = _program("pbt", tmp_path).result
    baseline = _program("pbt", tmp_path, "--no-pbt").result
    assert pbt["best"] > baseline["best"], (pbt, baseline)
    sweep = _sweep(tmp_path, "pbt_function_api_example")
    exploited = [t for t in sweep["trials"] if _events(t, "exploited")]
    donors = {e["donor"] for t in exploited for e in _events(t, "exploited")}
    assert exploited and all(_events(t, "donated") for t in sweep["trials"]
                             if t["dirname"].startswith(tuple(f"trial_{d}" for d in donors)))
    assert any(c["lr"] != 0.0001 for c in pbt["configs"])  # the explored configs
    table = run([HPCKIT, "ls", str(tmp_path / "pbt_function_api_example")], timeout=60).output
    assert "exploited" in table, table


def test_optuna_finds_the_optimum_of_a_known_function_behind_a_concurrency_limiter(tmp_path):
    found = _program("optuna", tmp_path, "--samples", "20", "--steps", "3").result
    best = found["best"]
    assert best["activation"] == "tanh" and best["height"] < -85 and best["width"] > 10, found
    assert len({json.dumps(c, sort_keys=True) for c in found["configs"]}) == 20


@pytest.mark.parametrize("again", ["the script", "hpckit resume"])
def test_a_sweep_driver_killed_mid_search_continues_the_same_search(again, tmp_path):
    """Run again as it was started, or with ``hpckit resume SWEEP``, which runs the command
    sweep.json recorded (from another directory, with nothing of the first run's
    environment but the tracker switch)."""
    whole = _program("optuna", tmp_path / "whole", "--samples", "10", "--steps", "2").result
    command = [sys.executable, str(SEEDS / "tune_optuna.py"), "--samples", "10", "--steps", "2"]
    env = {**os.environ, "HPCKIT_STORAGE": str(tmp_path / "cut"), "HOLD_AT_TRIAL": "00004",
           "PYTHONUNBUFFERED": "1", "HPCKIT_TENSORBOARD": "0"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT
    for line in process.stdout:  # type: ignore[union-attr]
        if line.startswith("HOLDING") or time.monotonic() > deadline:
            break
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    sweep = _sweep(tmp_path / "cut", "optuna_example")
    assert [t["status"] for t in sweep["trials"]] == ["TERMINATED"] * 4 + ["RUNNING"], sweep
    if again == "the script":
        resumed = _program("optuna", tmp_path / "cut", "--samples", "10", "--steps", "2").result
    else:
        assert sweep["command"]["argv"][1:] == ["--samples", "10", "--steps", "2"], sweep
        resumed = run([HPCKIT, "resume", str(tmp_path / "cut" / "optuna_example")],
                      timeout=TIMEOUT, env={"HPCKIT_TENSORBOARD": "0"}, cwd=tmp_path).result
    assert resumed["configs"] == whole["configs"]  # the same search, no trial repeated
    sweep = _sweep(tmp_path / "cut", "optuna_example")
    with open(tmp_path / "cut" / "optuna_example" / sweep["state"], "rb") as f:
        state = pickle.load(f)
    assert state["suggested"] == 10 and len(sweep["trials"]) == 10
    assert len(manifest(tmp_path / "cut" / "optuna_example" / sweep["trials"][4]["dirname"])[
        "attempts"]) == 2  # the held trial resumed


@pytest.mark.parametrize("phase", ["gathered", "committed"])
def test_a_kill_in_a_pause_checkpoint_loses_nothing_and_the_search_goes_on(phase, tmp_path):
    uncut = _program("hyperband", tmp_path / "whole")  # its output says where the pauses come
    whole = uncut.result
    # The first pause's checkpoint is the commit after the first trial was told to pause.
    before, _ = uncut.output.split(" pauses at iteration ", 1)
    paused = before.rsplit("trial ", 1)[1]
    commit = before.count("committed checkpoint_") + 1
    killed = _program("hyperband", tmp_path / "cut",
                      env={"HPCKIT_FAULT": f"{phase}:0:{commit}"}, expect=-signal.SIGKILL)
    assert "RESULT" not in killed.output
    sweep = _sweep(tmp_path / "cut", "hyperband_test")
    trial = next(t for t in sweep["trials"] if t["dirname"] == paused)
    assert (trial["status"], trial["decision"]) == ("RUNNING", "PAUSE"), trial
    again = _program("hyperband", tmp_path / "cut").result
    assert again == whole
    _no_leftovers(tmp_path / "cut" / "hyperband_test")


def test_a_kill_in_an_exploit_copy_loses_nothing(tmp_path):
    killed = _program("pbt", tmp_path, "--iterations", "9",
                      env={"HPCKIT_FAULT": "exploiting:0:1"}, expect=-signal.SIGKILL)
    assert "RESULT" not in killed.output
    _program("pbt", tmp_path, "--iterations", "9")
    root = tmp_path / "pbt_function_api_example"
    sweep = _sweep(tmp_path, "pbt_function_api_example")
    exploited = [t for t in sweep["trials"] if _events(t, "exploited")]
    assert exploited and all(t["status"] == "TERMINATED" for t in sweep["trials"])
    verified = run([HPCKIT, "verify", str(root / exploited[0]["dirname"])], timeout=60)
    assert verified.returncode == 0, verified.output
    _no_leftovers(root)


def _no_leftovers(sweep: Path) -> None:
    for trial in json.loads((sweep / "sweep.json").read_text())["trials"]:
        experiment = sweep / trial["dirname"]
        if not (experiment / "manifest.json").exists():
            continue
        named = {c["directory"] for c in manifest(experiment)["checkpoints"]}
        on_disk = {p.name for p in experiment.iterdir() if p.name.startswith("checkpoint_")}
        assert on_disk == named, (experiment, on_disk, named)


def _constant_loss(config):
    for _ in range(6):
        time.sleep(config.get("sleep", 0))
        tune.report({"loss": config["x"]})


def test_the_median_rule_stops_trials_below_the_median_and_a_time_budget_ends_the_sweep(
        tmp_path):
    from hpckit.tune.schedulers import MedianStoppingRule

    rule = MedianStoppingRule(time_attr="training_iteration", grace_period=1,
                              min_samples_required=2)
    grid = tune.Tuner(_constant_loss, param_space={"x": tune.grid_search([1, 2, 3, 4, 5])},
                      tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=rule),
                      run_config=tune.RunConfig(name="median", storage_path=str(tmp_path))).fit()
    iterations = {r.config["x"]: len(r.metrics_history) for r in grid}
    assert iterations[1] == 6 and iterations[5] < 6, iterations  # the worst stopped early
    started = time.monotonic()
    grid = tune.Tuner(_constant_loss, param_space={"x": 1, "sleep": 0.2},
                      tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=-1,
                                                  search_alg=_Counting(), time_budget_s=1.5),
                      run_config=tune.RunConfig(name="budget", storage_path=str(tmp_path))).fit()
    assert time.monotonic() - started < 20 and 1 <= len(grid) <= 3
    assert all(len(r.metrics_history) < 6 for r in grid[-1:])  # stopped at the budget


class _Counting(Searcher):
    def __init__(self):
        super().__init__(metric="score", mode="max")
        self.told = []

    def suggest(self, trial_id):
        return {"x": len(self.told)}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.told.append((trial_id, result))


def test_the_wrappers_limit_and_repeat_what_a_searcher_suggests():
    limited = ConcurrencyLimiter(_Counting(), max_concurrent=2)
    assert [limited.suggest(str(i)) for i in range(3)] == [{"x": 0}, {"x": 0}, None]
    limited.on_trial_complete("0", {"score": 1.0})
    assert limited.suggest("3") == {"x": 1}
    counting = _Counting()
    repeated = Repeater(counting, repeat=2)
    assert [repeated.suggest(str(i)) for i in range(2)] == [
        {"x": 0, "__trial_index__": 0}, {"x": 0, "__trial_index__": 1}]
    repeated.on_trial_complete("0", {"score": 1.0})
    repeated.on_trial_complete("1", {"score": 3.0})
    assert counting.told == [("0", {"score": 2.0})]  # once, with the mean


def test_every_search_space_function_draws_within_its_bounds_as_ray_bounds_them():
    space = {"q": tune.quniform(0, 1, 0.25), "ql": tune.qloguniform(1, 100, 5),
             "n": tune.randn(5, 0.1), "qn": tune.qrandn(0, 1, 0.5), "qi": tune.qrandint(0, 10, 5),
             "li": tune.lograndint(1, 1000), "twice": tune.sample_from(lambda s: s.config.qi * 2)}
    from hpckit.sweep.space import expand

    for params in expand(space, 40, 3):
        assert params["q"] in (0, 0.25, 0.5, 0.75, 1.0) and params["ql"] % 5 == 0
        assert 4 < params["n"] < 6 and (params["qn"] * 2).is_integer()
        assert params["qi"] in (0, 5, 10) and 1 <= params["li"] < 1000
        assert params["twice"] == 2 * params["qi"]
    assert expand(space, 5, 3) == expand(space, 5, 3)


@pytest.mark.parametrize("make, fragment", [
    (lambda: tune.TuneConfig(scheduler="asha"), "must be a TrialScheduler"),
    (lambda: tune.TuneConfig(search_alg=object()), "must be a Searcher"),
    (lambda: tune.TuneConfig(time_budget_s=0), "time_budget_s=0"),
    (lambda: tune.TuneConfig(num_samples=-1), "num_samples=-1"),
    (lambda: ASHAScheduler(reduction_factor=1), "reduction_factor=1"),
    (lambda: ASHAScheduler(max_t=1, grace_period=5), "max_t must be at least"),
    (lambda: HyperBandScheduler(mode="best"), "'max'"),
    (lambda: PopulationBasedTraining(), "hyperparam_mutations or custom_explore_fn"),
    (lambda: PopulationBasedTraining(hyperparam_mutations={"lr": 3}), "must be a list"),
    (lambda: PopulationBasedTraining(hyperparam_mutations={"lr": [1]}, quantile_fraction=0.9),
     "between 0 and 0.5"),
    (lambda: ConcurrencyLimiter(_Counting(), max_concurrent=0), "max_concurrent=0"),
    (lambda: tune.qrandint(0, 10, 0.5), "q=0.5"),
    (lambda: tune.lograndint(0, 10), "0 < lower"),
    (lambda: tune.sample_from(3), "needs a function"),
])
def test_bad_schedulers_searchers_and_spaces_say_what_would_be_right(make, fragment):
    with pytest.raises(ConfigError, match=fragment):
        make()


def test_a_scheduler_on_a_slurm_job_array_is_refused_naming_the_allocation_forms(
        tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "0")
    tuner = tune.Tuner(lambda config: None, param_space={"x": tune.uniform(0, 1)},
                       tune_config=tune.TuneConfig(metric="x", mode="max",
                                                   scheduler=ASHAScheduler()),
                       run_config=tune.RunConfig(name="arrayed", storage_path=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"AsyncHyperBandScheduler.*job array.*one allocation"):
        tuner.fit()
    assert not (tmp_path / "arrayed").exists()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("program, args", [("hyperband", ["--concurrent", "2"]),
                                           ("optuna", ["--samples", "6", "--steps", "2"])])
def test_a_scheduled_sweep_in_a_three_node_allocation_decides_as_on_one_node(
        program, args, tmp_path, slurm_nodes, hyperband_alone):
    """``python sweep.py`` in a three-node allocation: each trial a job step, its reports
    answered by the batch script's process through the sweep's folder; the same decisions,
    and the same search, as the sweep on one node."""
    alone = hyperband_alone if program == "hyperband" else _program(
        program, tmp_path / "alone", *args).result
    script = tmp_path / "sweep.sbatch"
    script.write_text(f"#!/bin/bash\n{sys.executable} {SEEDS / f'tune_{program}.py'} "
                      f"{' '.join(args)}\n")
    job = sbatch(slurm_nodes, tmp_path, script, "--nodes=3", "--ntasks-per-node=1",
                 HPCKIT_STORAGE=str(tmp_path / "spread"), HPCKIT_TENSORBOARD="0",
                 HPCKIT_LOCAL_DIR=str(slurm_nodes.local))
    assert wait(slurm_nodes, tmp_path, job, 240)[job] == "COMPLETED", output_of(tmp_path)
    output = output_of(tmp_path)
    assert json.loads(output.split("RESULT ", 1)[1].splitlines()[0]) == alone, output
    assert "as job steps across the 3 node(s)" in output, output
