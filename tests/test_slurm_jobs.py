"""The slurm/ templates, submitted with sbatch to a real one-node Slurm: finish, requeue,
time limit, job arrays, mpiexec inside an allocation, and hpckit resume --sbatch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import HPCKIT, STEADY, final_params, manifest, metrics_lines, run
from support.slurm_jobs import output_of, wait, wait_for_reports

TEMPLATES = Path(__file__).parent.parent / "slurm"


def submit(slurm, tmp_path: Path, template: str, *options: str, args: str, **env: str) -> str:
    environ = {**slurm.env, "PYTHON": sys.executable, "SCRIPT": str(STEADY), "SCRIPT_ARGS": args,
               **env}
    out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}",
                          f"--output={tmp_path}/%x-%A_%a.out", *options, str(TEMPLATES / template)],
                         env=environ, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


FAKE_STEP = """#!/bin/bash
touch "$FAKE_DIR/started"
sleep 1
exit "$FAKE_STATUS"
"""


@pytest.mark.quick
@pytest.mark.parametrize("template", ["requeue.sbatch", "mpirun.sbatch", "array-sweep.sbatch",
                                      "tune-array.sbatch", "resume --sbatch"])
def test_a_warning_as_the_ranks_end_leaves_the_job_their_exit_status(tmp_path, template):
    """A warning that came while the ranks were ending: the script held it for HOLD seconds,
    its job step ended meanwhile, and the script exited 138 (the interrupted ``wait``), so a
    run that had finished was a FAILED job. Now the step's own status is the job's. Run by
    bash outside Slurm, with ``srun`` and ``mpiexec`` a script that ends after a second with
    status 3 (so that neither the interrupted wait's status nor a made-up 0 can pass)."""
    status = 3
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "mpiexec"):
        (bin_dir / name).write_text(FAKE_STEP)
        (bin_dir / name).chmod(0o755)
    if template == "resume --sbatch":
        from hpckit.launch.slurm import warned_step
        script = tmp_path / "resume.sbatch"
        script.write_text("#!/bin/bash\ntrap 'warned=1' USR2\nset -euo pipefail\n"
                          + warned_step("srun python train.py") + "\n")
    else:
        script = TEMPLATES / template
    warning = signal.SIGUSR1 if template == "mpirun.sbatch" else signal.SIGUSR2
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
           "FAKE_STATUS": str(status), "MPIEXEC": str(bin_dir / "mpiexec"), "SRUN_MPI": "pmi2",
           "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_ARRAY_TASK_ID": "0",
           "HPCKIT_STORAGE": str(tmp_path)}
    job = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
            time.sleep(0.02)
        job.send_signal(warning)
        output, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == status, output


def test_one_node_template_finishes_with_its_checkpoints(tmp_path, slurm):
    job = submit(slurm, tmp_path, "one-node.sbatch", "--ntasks=2", "--cpus-per-task=1", "--time=5",
                 args=f"--storage {tmp_path} --name one --epochs 3")
    assert wait(slurm, tmp_path, job, 120) == {job: "COMPLETED"}, output_of(tmp_path)
    m = manifest(tmp_path / "one")
    assert m["latest"] == "checkpoint_000002" and m["world_size"] == 2
    assert m["attempts"][-1]["slurm"]["job_id"] == job and m["attempts"][-1]["launcher"] == "srun"


def test_mpiexec_inside_an_allocation(tmp_path, slurm):
    job = submit(slurm, tmp_path, "mpirun.sbatch", "--ntasks=2", "--cpus-per-task=1", "--time=5",
                 args=f"--storage {tmp_path} --name mpi --epochs 2")
    assert wait(slurm, tmp_path, job, 120) == {job: "COMPLETED"}, output_of(tmp_path)
    m = manifest(tmp_path / "mpi")
    assert m["latest"] == "checkpoint_000001" and m["attempts"][-1]["launcher"] == "mpiexec"


def test_requeued_job_resumes_and_ends_as_an_uninterrupted_run(tmp_path, slurm, steady_reference):
    job = submit(slurm, tmp_path, "requeue.sbatch", "--ntasks=2", "--cpus-per-task=1", "--time=10",
                 args=f"--storage {tmp_path} --epoch-seconds 1")
    experiment = tmp_path / "steady"  # the template's name (HPCKIT_NAME): the script's
    wait_for_reports(slurm, tmp_path, experiment, 3, 120)
    slurm.run("scontrol", "requeue", job)
    assert wait(slurm, tmp_path, job, 240) == {job: "COMPLETED"}, output_of(tmp_path)
    m = manifest(experiment)
    restarts = [a["slurm"].get("restart_count", "0") for a in m["attempts"]]
    assert restarts[0] == "0" and restarts[-1] >= "1" and m["attempts"][-1]["status"] == "finished"
    assert final_params(output_of(tmp_path)) == steady_reference
    assert [l["metrics"]["epoch"] for l in metrics_lines(experiment)] == list(range(8))
    # Submitted again (a new job id), the template continues the same experiment.
    again = submit(slurm, tmp_path, "requeue.sbatch", "--ntasks=2", "--cpus-per-task=1",
                   "--time=10", args=f"--storage {tmp_path} --epochs 9")
    assert wait(slurm, tmp_path, again, 120) == {again: "COMPLETED"}, output_of(tmp_path)
    assert [l["metrics"]["epoch"] for l in metrics_lines(experiment)] == list(range(9))
    assert manifest(experiment)["attempts"][-1]["slurm"]["job_id"] == again


def test_a_warning_as_the_job_starts_is_held_by_the_script_until_the_ranks_run(
        tmp_path, slurm, steady_reference):
    job = submit(slurm, tmp_path, "requeue.sbatch", "--ntasks=2", "--cpus-per-task=1", "--time=10",
                 args=f"--storage {tmp_path} --name held --epoch-seconds 2")
    deadline = time.monotonic() + 60
    # The script's first line sets its trap, its echo says it runs; srun starts right after.
    while f"job {job} restart 0" not in output_of(tmp_path):
        assert time.monotonic() < deadline, output_of(tmp_path) + slurm.logs()
        time.sleep(0.05)
    slurm.run("scancel", "--batch", "--signal=USR2", job)  # --signal=B:...: to the script
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    statuses = [(a["status"], a.get("error")) for a in manifest(tmp_path / "held")["attempts"]]
    assert statuses == [("requeued", "stop requested by SIGUSR2"), ("finished", None)], statuses
    assert final_params(output_of(tmp_path)) == steady_reference


def test_the_mpirun_template_checkpoints_requeues_and_resumes_at_the_warning(
        tmp_path, slurm, steady_reference):
    """mpirun.sbatch, where mpiexec starts the ranks: Slurm's warning to the script (sent as
    Slurm sends a ``--signal=B:`` warning) is passed to mpiexec as SIGUSR1, which Hydra
    forwards to every rank (it dies of SIGUSR2); they commit, requeue the job and exit, and
    the requeued job finishes the run exactly."""
    # Epochs of 2 s: the script holds the warning until the ranks have run 10 s (HOLD), and a
    # run of 8 epochs of 1 s that started quickly had ended by then.
    job = submit(slurm, tmp_path, "mpirun.sbatch", "--ntasks=2", "--cpus-per-task=1", "--time=10",
                 args=f"--storage {tmp_path} --name mr --epoch-seconds 2")
    wait_for_reports(slurm, tmp_path, tmp_path / "mr", 2, 120)
    slurm.run("scancel", "--batch", "--signal=USR1", job)  # --signal=B:USR1: to the script
    assert wait(slurm, tmp_path, job, 240) == {job: "COMPLETED"}, output_of(tmp_path)
    attempts = manifest(tmp_path / "mr")["attempts"]
    statuses = [(a["status"], a.get("error"), a["launcher"]) for a in attempts]
    assert statuses == [("requeued", "stop requested by SIGUSR1", "mpiexec"),
                        ("finished", None, "mpiexec")], statuses
    assert final_params(output_of(tmp_path)) == steady_reference


def test_time_limit_warning_checkpoints_requeues_and_finishes(tmp_path, slurm, steady_reference):
    # Slurm checks time limits every 30 s and sends the warning up to that much early: @30 of
    # a 1-minute job was sometimes sent as the ranks started, before Python could catch it.
    # @20 comes 10 to 40 s into the run, by where slurmctld's timer stands: the first run
    # trains 8 epochs of 6 s, so that it is always warned before it ends (with 4 s epochs it
    # ended unwarned about once in ten); requeued runs train the rest in epochs of 2 s. Its
    # ranks sleep through their epochs, waiting for Slurm's timer, while the test beside it
    # keeps the cores busy (its own burner made it wait for both cores for 45 s).
    job = submit(slurm, tmp_path, "requeue.sbatch", "--ntasks=2", "--cpus-per-task=1", "--time=1",
                 "--signal=USR2@20",
                 args=f"--storage {tmp_path} --name tl --first-run-epoch-seconds 6 "
                      "--epoch-seconds 2 --preemption-info")
    assert wait(slurm, tmp_path, job, 400) == {job: "COMPLETED"}, output_of(tmp_path)
    told = [json.loads(t) for t in re.findall(r"PREEMPTION (\{.*?\}) rank \d END",
                                               output_of(tmp_path))]
    # Each warning (one per run of the job that the limit reached) seen by both ranks, as one
    # answer whose deadline is the job's end: its 1-minute limit.
    deadlines = Counter(t["deadline_ms"] for t in told)
    assert deadlines and set(deadlines.values()) == {2}, told
    assert all(0 < t["deadline_ms"] / 1000 - t["seen"] <= 61 for t in told), told
    m = manifest(tmp_path / "tl")
    statuses = [a["status"] for a in m["attempts"]]
    assert "requeued" in statuses and statuses[-1] == "finished", m["attempts"]
    requeued = next(a for a in m["attempts"] if a["status"] == "requeued")
    assert requeued["error"] == "stop requested by SIGUSR2"
    assert final_params(output_of(tmp_path)) == steady_reference


def test_array_sweep_makes_one_experiment_per_task_and_a_rerun_resumes_them(tmp_path, slurm):
    # One rank a task, so that two tasks run at once on the two CPUs: multi-rank array tasks
    # are the Tune array test's.
    args = f"--storage {tmp_path} --epochs 2 --workers 1"
    job = submit(slurm, tmp_path, "array-sweep.sbatch", "--array=0-2", "--ntasks=1",
                 "--cpus-per-task=1", "--time=5", args=args, SWEEP_NAME="sw")
    assert set(wait(slurm, tmp_path, job, 240).values()) == {"COMPLETED"}, output_of(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("sw-"))
    assert names == ["sw-lr0.02", "sw-lr0.05", "sw-lr0.1"]
    for name in names:
        lr = float(name.split("lr")[1])
        assert manifest(tmp_path / name)["config"]["train_loop_config"]["lr"] == lr
    rerun = submit(slurm, tmp_path, "array-sweep.sbatch", "--array=0-2", "--ntasks=1",
                   "--cpus-per-task=1", "--time=5",
                   args=f"--storage {tmp_path} --epochs 3 --workers 1",
                   SWEEP_NAME="sw")
    assert set(wait(slurm, tmp_path, rerun, 240).values()) == {"COMPLETED"}, output_of(tmp_path)
    for name in names:
        assert [l["metrics"]["epoch"] for l in metrics_lines(tmp_path / name)] == [0, 1, 2]
        assert len(manifest(tmp_path / name)["attempts"]) == 2


def test_hpckit_resume_sbatch_submits_a_job_that_continues(tmp_path, slurm, steady_reference):
    process = subprocess.Popen(
        [sys.executable, str(STEADY), "--workers", "2", "--storage", str(tmp_path), "--name", "r",
         "--epoch-seconds", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, cwd=tmp_path)
    try:
        while not (tmp_path / "r" / "metrics.jsonl").exists():
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.2)
        process.send_signal(signal.SIGUSR2)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    script = tmp_path / "resume.sbatch"
    out = run([HPCKIT, "resume", "--sbatch", str(script), "--time", "5", "--slurm",
               "cpus-per-task=1", str(tmp_path / "r")], timeout=30, env=slurm.env)
    text = script.read_text()
    assert "#SBATCH --ntasks=2\n#SBATCH --time=5\n#SBATCH --cpus-per-task=1\n" in text, text
    assert f" -m hpckit resume {tmp_path / 'r'} --max-failures 0\n" in text, text
    job = re.search(r"submitted job (\d+)", out.output).group(1)
    assert wait(slurm, tmp_path, job, 180) == {job: "COMPLETED"}
    log = (tmp_path / f"r-{job}.out")
    assert final_params(log.read_text()) == steady_reference
    assert [a["status"] for a in manifest(tmp_path / "r")["attempts"]] == ["stopped", "finished"]


def test_a_tune_sweep_over_a_job_array_shares_the_trials_survives_a_requeue_and_resumes(
        tmp_path, slurm):
    """tune-array.sbatch: 2 tasks of 2 ranks share 3 one-rank trials (task 0: trials 0 and 2,
    packed on its ranks; task 1: trial 1). The stop signal reaches every task while its
    trials run: each trial commits, the tasks requeue, and the requeued tasks finish every
    trial with no step done twice. Resubmitted with `hpckit sweep`, nothing reruns."""
    sweep_script = str(Path(__file__).parent / "ranks" / "sweep.py")
    job = submit(slurm, tmp_path, "tune-array.sbatch", "--array=0-1", "--ntasks=2",
                 "--cpus-per-task=1", "--time=5", args=f"--storage {tmp_path}",
                 SCRIPT=sweep_script, STEP_SECONDS="1.5")
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("grid/trial_*/metrics.jsonl")):
        assert time.monotonic() < deadline, output_of(tmp_path)
        time.sleep(0.2)
    slurm.run("scancel", "--signal=USR2", job)
    assert set(wait(slurm, tmp_path, job, 240).values()) == {"COMPLETED"}, output_of(tmp_path)
    trials = json.loads((tmp_path / "grid" / "sweep.json").read_text())["trials"]
    assert len(trials) == 3, trials
    statuses = []
    for trial in trials:
        experiment = tmp_path / "grid" / trial["dirname"]
        attempts = manifest(experiment)["attempts"]
        statuses.append([a["status"] for a in attempts])
        assert {int(a["slurm"]["array_task_id"]) for a in attempts} == {trial["index"] % 2}
        assert [m["step"] for m in metrics_lines(experiment)] == [0, 1, 2], output_of(tmp_path)
    # Every trial was mid-run; task 0's two trials both asked Slurm to requeue it.
    assert statuses == [["requeued", "finished"]] * 3, (statuses, output_of(tmp_path))
    listed = run([HPCKIT, "ls", str(tmp_path / "grid")], timeout=60)
    assert listed.output.splitlines()[-1] == "3 trial(s): 3 finished", listed.output
    submitted = run([HPCKIT, "sweep", "--array", "2", "--ntasks", "2", "--time", "5",
                     "--slurm", "cpus-per-task=1", sweep_script, "--storage", str(tmp_path)],
                    timeout=30, env=slurm.env, cwd=tmp_path)
    again = re.search(r"submitted job (\d+) \(sweep.sbatch\)", submitted.output).group(1)
    assert "#SBATCH --array=0-1" in (tmp_path / "sweep.sbatch").read_text()
    assert set(wait(slurm, tmp_path, again, 240).values()) == {"COMPLETED"}, output_of(tmp_path)
    assert "3 trial(s), 0 to run (array task 1 of 2)" in output_of(tmp_path), output_of(tmp_path)
    for trial in trials:
        assert len(manifest(tmp_path / "grid" / trial["dirname"])["attempts"]) == 2
