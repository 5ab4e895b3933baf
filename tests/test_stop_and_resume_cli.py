"""Stop requests outside Slurm, `hpckit run` and `hpckit resume` (local experiments)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, JOB, STEADY, final_params, manifest, metrics_lines, run
from support.scenarios import driver_killed_then_rerun, wait_for_epochs

import hpckit
from hpckit import exits
from hpckit import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig
from hpckit.errors import ConfigError
from hpckit.launch.slurm import Layout, render_resume_job
from hpckit.settings import Settings
from hpckit.torch import TorchTrainer


@pytest.mark.parametrize("signum", [signal.SIGUSR2, signal.SIGTERM])
def test_stop_signal_without_slurm_stops_cleanly_and_resume_finishes_the_same(
        tmp_path, steady_reference, steady_torch_reference, signum):
    # SIGUSR2 goes from the launching process to the ranks; SIGTERM through mpiexec, and to
    # the whole process group: torch's data loader worker must not die of it.
    loader = ["--torch", "--loader-workers", "1"] if signum == signal.SIGTERM else []
    reference = steady_torch_reference if loader else steady_reference
    process = subprocess.Popen(
        [sys.executable, str(STEADY), "--workers", "2", "--storage", str(tmp_path), "--name", "s",
         "--epoch-seconds", "0.5", *loader],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for_epochs(tmp_path / "s", 2, process)
        if signum == signal.SIGTERM:
            os.killpg(process.pid, signum)  # as Slurm signals every process of a job step
        else:
            process.send_signal(signum)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == exits.STOPPED, output
    assert f"stop requested ({signum.name})" in output and "hpckit resume" in output
    m = manifest(tmp_path / "s")
    assert m["attempts"][-1]["status"] == "stopped" and m["latest"] is not None
    lines = metrics_lines(tmp_path / "s")
    assert lines[-1]["checkpoint"] == m["latest"] and len(lines) < 8

    out = run([HPCKIT, "resume", str(tmp_path / "s")], timeout=120)
    assert final_params(out.output) == reference
    m = manifest(tmp_path / "s")
    assert [a["status"] for a in m["attempts"]] == ["stopped", "finished"]
    assert [l["metrics"]["epoch"] for l in metrics_lines(tmp_path / "s")] == list(range(8))


def test_ranks_stop_when_their_driver_is_killed_and_the_rerun_resumes(tmp_path, steady_reference):
    """SIGKILL of `python train.py` (the out-of-memory killer, `kill -9`): mpiexec and every
    rank end within 15 s, after committing a checkpoint and releasing the experiment; the
    same command then resumes, and every epoch runs once."""
    driver_killed_then_rerun(tmp_path, steady_reference, sys.executable, {}, "SIGTERM")


STUCK = """
import sys, time
import hpckit
from hpckit import DataParallelTrainer, RunConfig, ScalingConfig

def loop(config):
    hpckit.report({"step": 0})
    print("STUCK", flush=True)
    time.sleep(600)  # never reaches its next report

DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                    run_config=RunConfig(name="stuck", storage_path=sys.argv[1])).fit()
"""


@pytest.mark.waiting  # it times the ending
def test_a_second_sigterm_kills_ranks_that_never_reach_a_report_and_nothing_restarts(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    process = subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        lines = []
        while not any("STUCK" in line for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        process.send_signal(signal.SIGTERM)
        time.sleep(6)  # the ranks took it, and wait in vain for their next report
        assert process.poll() is None, "".join(lines)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGTERM, "".join(lines) + output
    assert time.monotonic() - started < 10
    assert "killed after a second SIGTERM" in output and "hpckit resume" in output, output
    attempts = manifest(tmp_path / "stuck")["attempts"]
    assert [a["status"] for a in attempts] == ["interrupted"], attempts  # not restarted


def test_stop_agreed_at_a_report_without_checkpoint_is_visible_to_the_loop(tmp_path):
    seen = []

    def loop():
        hpckit.report({"step": 0})
        os.kill(os.getpid(), signal.SIGUSR2)
        hpckit.report({"step": 1})  # no checkpoint: the run goes on, but knows
        seen.append(hpckit.get_context().should_stop())
        d = tmp_path / "ckpt"
        d.mkdir()
        (d / "w").write_text("x")
        hpckit.report({"step": 2}, checkpoint=Checkpoint.from_directory(d))
        seen.append("not reached")

    # Not requeued (no Slurm job), so fit() raises PreemptionError as Ray does; uncaught, it
    # would end the program with status 75.
    with pytest.raises(hpckit.PreemptionError) as info:
        TorchTrainer(loop, run_config=RunConfig(name="e", storage_path=str(tmp_path / "s"))).fit()
    assert info.value.exit_status == exits.STOPPED and seen == [True]
    assert info.value.preemption_info.preempted_ranks == [0]
    m = manifest(tmp_path / "s" / "e")
    assert m["latest"] == "checkpoint_000000" and m["attempts"][-1]["status"] == "stopped"


def test_hpckit_run_restarts_after_a_failure(tmp_path):
    out = run([HPCKIT, "run", "-n", "2", "--max-failures", "1", str(JOB), "--storage", str(tmp_path),
               "--epochs", "3", "--fail-rank", "1", "--fail-epoch", "1"], timeout=150)
    assert "SEEN [1, 2]" in out.output and "restarting (restart 1 of 1)" in out.output
    attempts = manifest(tmp_path / "exp")["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "finished"], attempts
    assert attempts[0]["error"].startswith("the ranks exited with status 1"), attempts


def test_hpckit_run_gives_up_after_max_failures(tmp_path):
    out = run([HPCKIT, "run", "-n", "2", str(JOB), "--storage", str(tmp_path), "--fail-rank", "0"],
              timeout=90, expect=None)
    assert out.returncode not in (0, exits.STOPPED)


def test_resume_refuses_a_new_world_size_with_per_rank_shards(tmp_path):
    run([HPCKIT, "run", "-n", "2", str(JOB), "--storage", str(tmp_path), "--epochs", "1",
         "--checkpoint", "shards"], timeout=90)
    out = run([HPCKIT, "resume", "-n", "3", str(tmp_path / "exp")], timeout=30, expect=2)
    assert "files written by ranks [0, 1]" in out.output and "Use -n 2" in out.output


def test_resume_may_change_the_world_size_of_rank0_checkpoints(tmp_path):
    # No --workers: job.py takes the launched world, so the recorded command fits any size.
    run([HPCKIT, "run", "-n", "2", str(JOB), "--storage", str(tmp_path), "--epochs", "2"],
        timeout=90)
    out = run([HPCKIT, "resume", "-n", "3", str(tmp_path / "exp")], timeout=90)
    assert "with 3 rank(s)" in out.output
    last = manifest(tmp_path / "exp")["attempts"][-1]
    assert last["world_size"] == 3 and last["status"] == "finished"


def test_resume_with_n_changes_the_world_size_whatever_the_script_asks(tmp_path):
    """#66: python train.py with ScalingConfig(num_workers=2), checkpoints of rank 0's files:
    ``hpckit resume -n 1`` failed with "ScalingConfig(num_workers=2) but 1 rank(s) were
    launched", where the docs say -n changes the world size. The resumed run trains on the
    ranks -n asks for, and goes on from the checkpoint."""
    run([sys.executable, str(JOB), "--storage", str(tmp_path), "--epochs", "2", "--workers", "2"],
        timeout=90)
    manifest_path = tmp_path / "exp" / "manifest.json"
    body = json.loads(manifest_path.read_text())
    argv = body["command"]["argv"]
    argv[argv.index("--epochs") + 1] = "3"  # as if the script now trained an epoch more
    manifest_path.write_text(json.dumps(body))
    out = run([HPCKIT, "resume", "-n", "1", str(tmp_path / "exp")], timeout=90)
    assert "with 1 rank(s)" in out.output, out.output
    last = manifest(tmp_path / "exp")["attempts"][-1]
    assert last["world_size"] == 1 and last["status"] == "finished", last
    assert manifest(tmp_path / "exp")["latest"] == "checkpoint_000002"


def test_resume_of_something_that_is_not_an_experiment(tmp_path):
    out = run([HPCKIT, "resume", str(tmp_path)], timeout=30, expect=2)
    assert "not an hpckit experiment" in out.output


def test_resume_takes_job_options_only_for_a_job_script(tmp_path):
    out = run([HPCKIT, "resume", "--time", "02:00:00", str(tmp_path)], timeout=30, expect=2)
    assert "--time, --slurm and --dry-run are options of the job script: add --sbatch FILE" in out.output
    out = run([HPCKIT, "resume", "--sbatch", str(tmp_path / "x.sbatch"), "--slurm", "gpu",
               str(tmp_path)], timeout=30, expect=2)
    assert "'gpu': give KEY=VALUE" in out.output, out.output


def _with_command(tmp_path: Path, **command: object) -> Path:
    """An experiment whose manifest records ``command`` (the keys given replace its own)."""
    def loop(config):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "w").write_text("x")
            hpckit.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d))

    DataParallelTrainer(loop, run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    path = tmp_path / "e" / "manifest.json"
    body = json.loads(path.read_text())
    # A script, not the test process's own argv (under pytest-xdist a worker is `python -c`).
    body["command"].update({"argv": [str(JOB)], **command})
    path.write_text(json.dumps(body))
    return tmp_path / "e"


@pytest.mark.parametrize("command,expected", [
    ({"argv": ["-c"]}, "was started with python -c, whose code Python does not keep"),
    ({"cwd": "/nonexistent/project"}, "was started in /nonexistent/project, which no longer "
                                      "exists"),
])
def test_resume_of_a_command_that_cannot_run_again_is_one_line(tmp_path, command, expected):
    """#51, item 12: a bare `python -c`, or 'unexpected FileNotFoundError ... bug'."""
    experiment = _with_command(tmp_path, **command)
    out = run([HPCKIT, "resume", str(experiment)], timeout=60, expect=2)
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out.output


def test_resume_with_a_job_script_in_a_missing_directory_is_one_line(tmp_path):
    experiment = _with_command(tmp_path)
    script = tmp_path / "nonexistent" / "x.sbatch"
    out = run([HPCKIT, "resume", "--sbatch", str(script), str(experiment)], timeout=60,
              expect=1)
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and f"cannot write the job script {script}" in lines[0], out.output


def test_the_resume_job_script_matches_the_golden_file():
    """slurm/multi-node.sbatch's form, hpckit resume itself the batch process: the last
    allocation's three nodes of one rank (a spare among them) for a world of two."""
    text = render_resume_job("/lustre/me/runs/resnet", Layout.of(2, "1(x2)", 3),
                             ["--max-failures", "3"], "/home/me/proj", "resnet",
                             "/home/me/venv/bin/python", ("--time=04:00:00",))
    assert text == (HERE / "golden" / "resume.sbatch").read_text()


def test_resume_sbatch_dry_run_prints_the_job_script_and_submits_nothing(tmp_path):
    """``hpckit resume --sbatch FILE --dry-run``: the script that would be submitted, the
    golden file's for a run whose last allocation had three nodes of one rank; FILE is not
    written, so nothing was submitted."""
    def loop(config):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "w").write_text("x")
            hpckit.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d))

    DataParallelTrainer(loop, run_config=RunConfig(
        name="resnet", storage_path=str(tmp_path / "runs"),
        failure_config=FailureConfig(max_failures=3))).fit()
    path = tmp_path / "runs" / "resnet" / "manifest.json"
    body = json.loads(path.read_text())
    (tmp_path / "proj").mkdir()
    body["command"].update({"argv": [str(JOB)], "cwd": str(tmp_path / "proj"),
                            "executable": "/home/me/venv/bin/python"})
    body["world_size"] = 2
    body["attempts"][-1]["slurm"] = {"job_id": "7", "nodelist": "n[1-3]",
                                     "tasks_per_node": "1(x2)"}
    path.write_text(json.dumps(body))
    conf = tmp_path / "slurm.conf"  # enough for scontrol to expand n[1-3]
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    script = tmp_path / "resume.sbatch"
    out = run([HPCKIT, "resume", str(tmp_path / "runs" / "resnet"), "--sbatch", str(script),
               "--time", "04:00:00", "--dry-run"], timeout=60, env={"SLURM_CONF": str(conf)})
    shown = out.output.replace(str(tmp_path / "runs"), "/lustre/me/runs").replace(
        str(tmp_path / "proj"), "/home/me/proj")
    assert shown == (HERE / "golden" / "resume.sbatch").read_text(), out.output
    assert not script.exists()
    alone = run([HPCKIT, "resume", str(tmp_path / "runs" / "resnet"), "--dry-run"], timeout=60,
                expect=2)
    assert "--dry-run are options of the job script: add --sbatch FILE" in alone.output


@pytest.mark.quick
@pytest.mark.parametrize(("ntasks", "per_node", "nodes", "directives"), [
    (2, "1(x2)", 3, ["--nodes=3", "--ntasks-per-node=1", "--no-kill"]),
    (8, "4,4", 2, ["--nodes=2", "--ntasks-per-node=4", "--no-kill"]),
    (4, "4", 1, ["--ntasks=4"]),               # one node: as the run had it
    (8, "2(x2)", 2, ["--ntasks=8"]),           # too few for the world: Slurm lays them out
    (2, None, 3, ["--ntasks=2"]),
    (2, "2(x", 3, ["--ntasks=2"])])
def test_a_resumed_job_asks_for_the_last_allocations_nodes(ntasks, per_node, nodes, directives):
    assert Layout.of(ntasks, per_node, nodes).directives() == directives


@pytest.mark.parametrize("environ,expected", [
    ({"SLURM_JOB_ID": "12"}, "12"),
    ({"SLURM_JOB_ID": "13", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "3"}, "10_3"),
    ({}, None),
])
def test_requeue_target_is_array_aware(environ, expected):
    assert Settings.read(environ).job_to_requeue == expected


def test_stop_signal_names():
    def parse_signal(name):
        return Settings.read({"HPCKIT_STOP_SIGNAL": name} if name else {}).stop_signal

    assert parse_signal(None) == signal.SIGUSR2
    assert parse_signal("usr1") == signal.SIGUSR1 and parse_signal("SIGTERM") == signal.SIGTERM
    with pytest.raises(ConfigError, match="HPCKIT_STOP_SIGNAL='USR9' is invalid: use a signal name"):
        parse_signal("USR9")


def test_hpckit_sweep_writes_an_array_job_whose_tasks_share_the_trials(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text("")
    out = run([HPCKIT, "sweep", "--array", "4", "--ntasks", "2", "--time", "01:00:00",
               "--slurm", "partition=gpu", "--dry-run", str(script), "--epochs", "3"],
              timeout=30, cwd=tmp_path)
    lines = out.output.splitlines()
    for line in ["#SBATCH --array=0-3", "#SBATCH --ntasks=2", "#SBATCH --time=01:00:00",
                 "#SBATCH --partition=gpu", "#SBATCH --output=sweep-%A_%a.out", "#SBATCH --requeue"]:
        assert line in lines, out.output
    step = [line for line in lines if line.startswith("srun ")]
    assert len(step) == 1 and step[0].endswith(f"{script} --epochs 3 &"), out.output
    assert "#SBATCH --signal=B:USR2@120" in lines and lines[-1] == 'exit "$status"', out.output
    assert not (tmp_path / "sweep.sbatch").exists()  # a dry run writes nothing
    bad = run([HPCKIT, "sweep", "--array", "2", "--slurm", "gpu", str(script)], timeout=30,
              expect=2)
    assert "give KEY=VALUE, e.g. partition=gpu" in bad.output


@pytest.mark.quick
def test_resume_of_a_sweep_refuses_what_its_command_cannot_do_again(tmp_path):
    """``hpckit resume SWEEP`` runs the command sweep.json recorded; what that cannot be is
    said in one line before anything starts: -n and --max-failures (a trial's are its
    trainer's), --sbatch (the sweep's job script is the user's), an array task's sweep, and
    a sweep planned by an hpckit that recorded no command."""
    from click.testing import CliRunner

    from hpckit.cli import main

    def resume(command: dict | None, *options: str) -> str:
        sweep = tmp_path / "sweep"
        sweep.mkdir(exist_ok=True)
        body = {"format": 1, "name": "sweep", "seed": 1, "num_samples": 1, "metric": None,
                "mode": None, "trials": [], **({"command": command} if command else {})}
        (sweep / "sweep.json").write_text(json.dumps(body))
        out = CliRunner().invoke(main, ["resume", str(sweep), *options])
        assert out.exit_code == 2, out.output
        return " ".join(out.output.split())

    started = {"argv": ["sweep.py"], "cwd": str(tmp_path), "launcher": "python", "ranks": 1,
               "array": False}
    assert "resume it without -n and --max-failures" in resume(started, "-n", "2")
    assert "resume it without -n and --max-failures" in resume(started, "--max-failures", "1")
    assert "submit that again (sbatch FILE)" in resume(started, "--sbatch", str(tmp_path / "x"))
    assert "submit the array job again" in resume({**started, "array": True})
    assert "records no command" in resume(None)
    assert "started in" in resume({**started, "cwd": str(tmp_path / "gone")})


@pytest.mark.quick
def test_resume_of_a_sweep_continues_that_sweep_whatever_its_script_now_names(tmp_path, caplog):
    """Under ``hpckit resume SWEEP`` (``HPCKIT_RESUME=<sweep>``) the Tuner continues SWEEP even
    where the script's RunConfig now names another, saying so; no trial's trainer is
    redirected to it (that value names no training function)."""
    from hpckit import tune
    from hpckit import ScalingConfig
    from hpckit.run.job import RESUMED_SWEEP, Backend, TrainingJob

    def train(config):
        pass

    tuner = tune.Tuner(train, run_config=RunConfig(name="renamed", storage_path=str(tmp_path)))
    resumed = Settings(resume=RESUMED_SWEEP, name="sweep", storage=str(tmp_path / "there"))
    assert tuner._location(resumed).display == str(tmp_path / "there" / "sweep")
    assert f"not {tmp_path / 'renamed'}" in caplog.text
    assert tuner._location(Settings(name="sweep")).display == str(tmp_path / "renamed")
    job = TrainingJob(train, None, ScalingConfig(), RunConfig(name="trial_00000",
                                                             storage_path=str(tmp_path)),
                      None, Backend())
    assert job.resumed(resumed) == (job, None)
