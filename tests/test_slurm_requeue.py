"""Requeue, time limits and start-up with the sbatch scripts users write themselves, not
hpckit's templates: a minimal script (ntasks, --requeue, a plain srun), requeued mid-run on a
test cluster whose job ids start at 1; the stop signal sent while the ranks are still
starting; a rank that dies during start-up. Both cores are kept busy by a CPU burner."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, STEADY, final_params, manifest, metrics_lines, mpiexec
from support.once import computed_once
from support.slurm_jobs import SLOW_START, minimal_script, output_of, sbatch, wait, wait_for_reports



@pytest.fixture(scope="session")  # computed once a worker, whatever the order of tests
def three_rank_reference(tmp_path_factory) -> list[float]:
    def compute() -> list[float]:
        storage = tmp_path_factory.mktemp("reference3")
        return final_params(mpiexec(3, "--storage", str(storage), "--name", "ref", script=STEADY,
                                    timeout=120).output)

    return computed_once(tmp_path_factory, "steady-3-ranks", compute)


@pytest.mark.alone  # it loads both cores itself
def test_a_plain_user_script_requeued_mid_run_ends_as_an_uninterrupted_run(
        tmp_path, slurm, cpu_burner, three_rank_reference):
    # Three tasks (odd, and not the two of the other requeue tests); two added 45 s and no
    # case that three and the other tests miss.
    reference = three_rank_reference
    command = f"{sys.executable} {STEADY} --storage {tmp_path} --epoch-seconds 1"
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 3, command), "--time=10")
    experiment = tmp_path / f"steady-job{job}"  # the default name: requeued, it resumes
    wait_for_reports(slurm, tmp_path, experiment, 3, 180)
    slurm.run("scontrol", "requeue", job)
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    output = output_of(tmp_path)
    # The killed incarnation's MPICH segments were found under the requeued job's names.
    assert "removed MPICH shared memory that a killed run of Slurm job step" in output, output
    assert final_params(output) == reference
    assert [line["metrics"]["epoch"] for line in metrics_lines(experiment)] == list(range(8))
    assert [a["status"] for a in manifest(experiment)["attempts"]][-1] == "finished"


@pytest.mark.alone  # it loads both cores itself
def test_the_stop_signal_during_start_up_is_kept_and_the_job_requeues_and_completes(
        tmp_path, slurm, cpu_burner, steady_reference):
    marker = tmp_path / "starting"
    command = f"{sys.executable} {SLOW_START} --storage {tmp_path} --name early"
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=10",
                 SLOW_START_MARKER=str(marker))
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("starting.*"))) < 2:
        assert time.monotonic() < deadline, output_of(tmp_path) + slurm.logs()
        time.sleep(0.2)
    slurm.run("scancel", "--signal=USR2", job)  # to the ranks, which are still starting
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    statuses = [(a["status"], a.get("error")) for a in manifest(tmp_path / "early")["attempts"]]
    assert statuses == [("requeued", "stop requested by SIGUSR2"), ("finished", None)], statuses
    assert final_params(output_of(tmp_path)) == steady_reference


@pytest.mark.alone  # it loads both cores itself and times the ending
def test_a_rank_that_dies_during_start_up_ends_the_others_within_a_minute(
        tmp_path, slurm, cpu_burner):
    started = time.monotonic()
    out = slurm.run("srun", "--ntasks=3", "--cpus-per-task=1", sys.executable, str(SLOW_START),
                    "--storage", str(tmp_path), "--name", "dies", timeout=120, check=False,
                    env_extra={"DIE_RANK": "1"})
    elapsed = time.monotonic() - started
    text = out.stdout + out.stderr
    assert out.returncode != 0 and elapsed < 60, f"{elapsed:.0f} s:\n{text}"
    assert "rank died during start-up (injected by the test)" in text
    assert re.search(r"rank 1( \(pid \d+\))? .*exited before MPI start-up completed", text), text
    assert "rank 0] ERROR" in text and "rank 2] ERROR" in text, text


def wait_for_output(slurm, tmp_path: Path, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not (found := re.search(pattern, output_of(tmp_path))):
        assert time.monotonic() < deadline, f"no {pattern!r}:\n{output_of(tmp_path)}{slurm.logs()}"
        time.sleep(0.5)
    return found.group(0)


def preemption_infos(output: str) -> list[dict]:
    return [json.loads(info) for info in re.findall(r"INFO \d+ (\{.*?\}) END", output)]


def test_preemption_requeues_count_apart_from_failures_and_stop_at_max_preemption_failures(
        tmp_path, slurm):
    # hpckit run restarts after the injected failure (max_failures=1); the first scancel
    # --signal is then still requeued (max_preemption_failures=1: the failure did not count),
    # and the second, in the requeued job, is not.
    command = (f"{HPCKIT} run -n 2 --max-failures 1 {HERE / 'ranks' / 'preempted.py'} "
               f"--storage {tmp_path} --max-preemption-failures 1 --fail-once-at 1 "
               "--poll-after 3")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 1, command), "--time=10",
                 "--cpus-per-task=2")
    wait_for_output(slurm, tmp_path, r"WAITING 0 1 END", 120)  # restarted after the failure
    sent = time.time()
    slurm.run("scancel", "--signal=USR2", job)
    wait_for_output(slurm, tmp_path, r"WAITING 1 \d+ END", 180)  # the requeued job
    slurm.run("scancel", "--signal=USR2", job)
    wait(slurm, tmp_path, job, 120)
    output = output_of(tmp_path)
    told = preemption_infos(output)
    assert len(told) == 4 and told[0] == told[1], output  # both ranks, one answer, each time
    assert told[0]["nodes"] == {socket.gethostname(): [0, 1]}
    assert sent < told[0]["deadline_ms"] / 1000 <= sent + 10 * 60 + 5, told  # --time=10
    attempts = manifest(tmp_path / "preempted")["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "requeued", "stopped"], attempts
    # Rank 1 failed and MPI ended rank 0 before it could record why; hpckit run saw it.
    assert attempts[0]["error"].startswith("the ranks exited with status 1"), attempts
    assert "not requeued: FailureConfig(max_preemption_failures=1)" in attempts[-1]["error"]


@pytest.mark.waiting  # the job must stop within Slurm's grace time
def test_slurm_preemption_sigterm_stops_at_the_next_report_and_requeues_within_the_grace_time(
        tmp_path, slurm):
    # The job takes the whole node; an "urgent" job preempts it. Slurm sends SIGTERM and sets
    # the job's end to now + GraceTime (20 s). Slurm would not requeue a job that ends by
    # itself before then: hpckit does, after the checkpoint.
    command = (f"{sys.executable} {HERE / 'ranks' / 'preempted.py'} --storage {tmp_path} "
               "--steps 8 --poll-after 2 --poll-restarts 0")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=10",
                 "--cpus-per-task=4")
    wait_for_output(slurm, tmp_path, r"WAITING 0 0 END", 120)
    sent = time.time()
    urgent = subprocess.run(["sbatch", "--parsable", "--partition=urgent", "--ntasks=1",
                             "--cpus-per-task=8", f"--output={tmp_path}/urgent.log",
                             "--wrap=true"], env=slurm.env, capture_output=True, text=True,
                            timeout=30)
    assert urgent.returncode == 0, urgent.stderr
    wait_for_output(slurm, tmp_path, r"INFO 7 null END", 240)  # the requeued job finished
    wait(slurm, tmp_path, job, 60)
    output = output_of(tmp_path)
    told = [t for t in preemption_infos(output)]
    assert len(told) == 2 and told[0] == told[1], output
    # GraceTime=20 from the preemption, which the scheduler makes within its next passes.
    assert sent < told[0]["deadline_ms"] / 1000 <= sent + 20 + 40, told
    attempts = manifest(tmp_path / "preempted")["attempts"]
    assert [a["status"] for a in attempts] == ["requeued", "finished"], attempts
    assert attempts[0]["error"].startswith("stop requested by SIGTERM"), attempts
    steps = [line["metrics"]["step"] for line in metrics_lines(tmp_path / "preempted")]
    assert steps == list(range(8)), steps  # resumed after the checkpoint taken at SIGTERM


def test_scancel_sigterm_commits_and_stops_and_the_job_stays_cancelled(tmp_path, slurm):
    command = (f"{sys.executable} {HERE / 'ranks' / 'preempted.py'} --storage {tmp_path} "
               "--steps 8 --poll-after 2")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=10")
    wait_for_output(slurm, tmp_path, r"WAITING 0 0 END", 120)
    slurm.run("scancel", job)  # SIGTERM to the ranks, SIGKILL after KillWait (30 s)
    assert wait(slurm, tmp_path, job, 60) == {job: "CANCELLED"}, output_of(tmp_path)
    attempts = manifest(tmp_path / "preempted")["attempts"]
    assert [a["status"] for a in attempts] == ["stopped"], attempts
    assert "not requeued: SIGTERM without a Slurm preemption" in attempts[0]["error"], attempts
    steps = [line["metrics"]["step"] for line in metrics_lines(tmp_path / "preempted")]
    assert steps == [0, 1, 2], steps  # the step at which SIGTERM came was committed
