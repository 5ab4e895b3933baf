"""How a run ends when it cannot start, and when a person presses Ctrl-C, as they see it:
real processes, real SIGINT to the process group, and the output, exit status and manifest
that follow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, MPIEXEC, manifest, metrics_lines, run


NEWCOMER = HERE / "ranks" / "newcomer.py"
# What a shell reports for a process ended by Ctrl-C: 130 from an exit status, or death by
# SIGINT (Python re-raises the signal after an uncaught KeyboardInterrupt).
INTERRUPTED = (130, -signal.SIGINT)


def _last_attempt(experiment: Path) -> dict:
    return manifest(experiment)["attempts"][-1]


@pytest.mark.parametrize("launch", ["python", "mpiexec"])
def test_no_cuda_is_one_line_and_a_failed_attempt(tmp_path, launch):
    prefix = [sys.executable] if launch == "python" else [MPIEXEC, "-n", "2", sys.executable]
    out = run([*prefix, str(NEWCOMER), "--storage", str(tmp_path), "--gpu"], timeout=120, expect=1)
    lines = out.output.splitlines()
    errors = [line for line in lines if line.startswith("hpckit: error:")]
    assert len(lines) <= 20 and len(errors) == 1 and "Traceback" not in out.output, out.output
    assert "use_gpu=True" in errors[0] and "set use_gpu=False" in errors[0]
    attempt = _last_attempt(tmp_path / "newcomer")
    assert attempt["status"] == "failed" and "no CUDA device" in attempt["error"]
    gc = subprocess.run([HPCKIT, "gc", str(tmp_path / "newcomer")], capture_output=True,
                        text=True, timeout=60)
    assert gc.returncode == 0, gc.stderr  # nothing is left looking "running"


def test_start_up_errors_are_one_line_and_tracebacks_only_when_debugging(tmp_path):
    mismatch = [MPIEXEC, "-n", "3", sys.executable, str(NEWCOMER), "--storage", str(tmp_path)]
    out = run(mismatch, timeout=90, expect=1)
    assert out.output.strip().splitlines() == [
        "hpckit: error: ScalingConfig(num_workers=2) but 3 rank(s) were launched; make them "
        "agree (mpirun -n 2 ..., srun --ntasks=2) or set num_workers=3."]
    debug = run(mismatch, timeout=90, expect=1, env={"HPCKIT_LOG_LEVEL": "DEBUG"})
    assert "Traceback" in debug.output
    unwritable = tmp_path / "file"
    unwritable.write_text("not a directory")
    out = run([sys.executable, str(NEWCOMER), "--storage", str(unwritable), "--workers", "1"],
              timeout=90, expect=1)
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpckit: error:") and str(unwritable) in lines[0]


def _start(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def _interrupt_after(process: subprocess.Popen[str], experiment: Path, reports: int,
                     again_after: float | None = None) -> tuple[str, float]:
    """Ctrl-C to the whole process group once ``reports`` reports were committed; the output
    and the seconds from the (first) Ctrl-C to the end."""
    deadline = time.monotonic() + 90
    while len(metrics_lines(experiment)) < reports if (experiment / "metrics.jsonl").exists() else True:
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"the run ended or stalled before {reports} reports:\n{process.communicate()[0]}")
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    pressed = time.monotonic()
    if again_after is not None:
        time.sleep(again_after)
        os.killpg(process.pid, signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"still running 60 s after Ctrl-C:\n{process.communicate()[0]}")
    return output, time.monotonic() - pressed


@pytest.mark.parametrize("launch", ["python-1", "python-2", "mpiexec-3"])
def test_ctrl_c_records_interrupted_says_how_to_resume_and_a_rerun_resumes(tmp_path, launch):
    kind, ranks = launch.split("-")
    args = [str(NEWCOMER), "--storage", str(tmp_path), "--workers", ranks, "--max-failures", "3"]
    prefix = [sys.executable] if kind == "python" else [MPIEXEC, "-n", ranks, sys.executable]
    output, _ = _interrupt_after(_start([*prefix, *args]), tmp_path / "newcomer", 3)
    experiment = tmp_path / "newcomer"
    body = manifest(experiment)
    said = [line for line in output.splitlines() if "interrupted;" in line]
    assert "Traceback" not in output and len(said) == 1, output
    others = [line for line in output.splitlines() if line not in said and not (
        line.startswith("STEP ") or " INFO " in line or line.startswith("[mpiexec@"))]
    assert others == [], output
    if kind == "python":  # hpckit passed Ctrl-C to the ranks itself: mpiexec said nothing
        assert "[mpiexec@" not in output, output
    latest = str(experiment / body["latest"])
    assert f"the latest committed checkpoint is {latest}. To resume" in said[0]
    assert f"hpckit resume {experiment}" in said[0]
    assert [a["status"] for a in body["attempts"]] == ["interrupted"], body["attempts"]  # no retry
    assert body["attempts"][0]["reports"] >= 3  # recorded by rank 0, not guessed afterwards
    committed = len(metrics_lines(experiment))
    again = run([*prefix, *args[:-2], "--steps", str(committed + 2)], timeout=120)
    steps = [m["step"] for m in metrics_lines(experiment)]
    assert steps == list(range(committed + 2)), again.output  # continued, nothing repeated
    assert [a["status"] for a in manifest(experiment)["attempts"]] == ["interrupted", "finished"]


def test_process_exit_status_is_130_after_ctrl_c(tmp_path):
    process = _start([MPIEXEC, "-n", "2", sys.executable, str(NEWCOMER), "--storage", str(tmp_path)])
    output, _ = _interrupt_after(process, tmp_path / "newcomer", 2)
    assert process.returncode in INTERRUPTED, output
    cli = _start([HPCKIT, "run", "-n", "2", "--max-failures", "2", str(NEWCOMER),
                  "--storage", str(tmp_path), "--name", "cli"])
    output, _ = _interrupt_after(cli, tmp_path / "cli", 2)
    assert cli.returncode == 130 and "Traceback" not in output, output
    assert [a["status"] for a in manifest(tmp_path / "cli")["attempts"]] == ["interrupted"]


@pytest.mark.alone  # it times the ending against the grace period
def test_a_second_ctrl_c_ends_at_once(tmp_path):
    """Rank 1 waits inside MPI (a collective of the user's), rank 0 inside report() for it.
    Ctrl-C reaches rank 0 there, which records the attempt and gives rank 1 the grace period
    to meet; a second Ctrl-C ends that wait."""
    from hpckit.run.ending.exit import INTERRUPT_GRACE

    args = [sys.executable, str(NEWCOMER), "--stuck", "--sleep", "0.3"]
    output, once = _interrupt_after(_start([*args, "--storage", str(tmp_path / "a")]),
                                    tmp_path / "a" / "newcomer", 2)
    assert once >= INTERRUPT_GRACE, output
    recorded = _last_attempt(tmp_path / "a" / "newcomer")
    assert recorded["status"] == "interrupted" and recorded["reports"] >= 2, recorded
    assert output.count("interrupted; the latest committed checkpoint is") == 1, output
    # The second comes 0.5 s later: Popen.wait() itself swallows a Ctrl-C in its first 0.25 s.
    output, twice = _interrupt_after(_start([*args, "--storage", str(tmp_path / "b")]),
                                     tmp_path / "b" / "newcomer", 2, again_after=0.5)
    assert twice < INTERRUPT_GRACE, output
    assert json.loads((tmp_path / "b" / "newcomer" / "manifest.json").read_text())[
        "attempts"][-1]["status"] == "interrupted"


def test_after_ctrl_c_the_program_gets_the_interrupt_and_its_ctrl_c_back(tmp_path):
    process = _start([sys.executable, str(NEWCOMER), "--storage", str(tmp_path), "--workers", "1",
                      "--catch"])
    output, _ = _interrupt_after(process, tmp_path / "newcomer", 2)
    assert process.returncode == 0, output
    assert "CAUGHT KeyboardInterrupt; default handler back: True" in output


def test_a_config_error_is_printed_by_rank_0_and_a_single_ranks_error_by_that_rank(tmp_path):
    config = run([MPIEXEC, "-n", "3", sys.executable, "-c",
                  "import hpckit; hpckit.ScalingConfig(num_workers=0)"], timeout=60, expect=1)
    assert config.output.strip().splitlines() == [
        line for line in config.output.strip().splitlines() if line.startswith("hpckit: error:")]
    assert len(config.output.strip().splitlines()) == 1, config.output
    alone = run([MPIEXEC, "-n", "2", sys.executable, "-c",
                 "import os, hpckit\nif os.environ['PMI_RANK'] == '1':\n"
                 "    raise hpckit.ConfigError('only rank 1 cannot open its data')"],
                timeout=60, expect=None)
    assert "hpckit: error: only rank 1 cannot open its data" in alone.output, alone.output


def test_ctrl_c_during_a_deferred_step_is_raised_after_it():
    from hpckit.background import deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, and must not raise
            done.append("whole")
    assert done == ["whole"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("nodes", [[], ["1"], ["2"]], ids=["world", "each-rank-a-node", "nodes-of-2"])
def test_ctrl_c_reaches_ranks_that_wait_in_a_step_for_a_rank_that_never_comes(nodes, tmp_path):
    """Each rank waits for the others in Python, never inside a blocking MPI call (where no
    signal handler runs): rank 0, waiting for rank 1, stops on its own SIGINT, and rank 2,
    waiting for rank 0's result, hears from rank 0 and stops too; also where the step gathers
    through node leaders, rank 2 leading a node of its own."""
    ready = tmp_path / "rank0.pid"
    process = _start([MPIEXEC, "-n", "3", sys.executable, str(HERE / "ranks" / "interrupted_step.py"),
                      str(ready), *nodes])
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.05)
    time.sleep(0.5)  # rank 0 is waiting now
    os.kill(int(ready.read_text()), signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"ranks still waiting 30 s after Ctrl-C:\n{process.communicate()[0]}")
    assert process.returncode == 0, output
    for rank in (0, 2):
        assert f"rank {rank} interrupted after" in output, output
    assert "completed the step" not in output, output


HUNG_PUT = """
import sys
import pyarrow.fs
from hpckit.experiment.writer import Writer

s3 = pyarrow.fs.S3FileSystem(access_key="hung", secret_key="hung", scheme="http",
                             endpoint_override=sys.argv[1], request_timeout=60,
                             connect_timeout=60)

def put():
    print("PUTTING", flush=True)
    with s3.open_output_stream("bucket/manifest.json") as f:
        f.write(b"{}")

Writer("hung").run(put)  # as rank 0's training thread hands the experiment's writer a change
print("AFTER THE STEP", flush=True)
"""


def test_a_second_ctrl_c_ends_a_process_stuck_in_an_s3_put(tmp_path):
    """A PUT to an endpoint that takes the connection and never answers waits inside
    pyarrow's C++, where the main thread would run no signal handler for 60 s: the change runs
    on the experiment's writer thread, and the second Ctrl-C ends the process at once."""
    import socket

    with socket.create_server(("127.0.0.1", 0), backlog=8) as hung:  # never accepts
        process = subprocess.Popen([sys.executable, "-c", HUNG_PUT,
                                    f"127.0.0.1:{hung.getsockname()[1]}"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "PUTTING"
            time.sleep(0.5)  # into the PUT: its connection is made, the request sent
            process.send_signal(signal.SIGINT)
            time.sleep(0.2)
            process.send_signal(signal.SIGINT)
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"still in the PUT 20 s after a second Ctrl-C:\n{process.communicate()[0]}")
    assert process.returncode == 130, output
    assert "a second Ctrl-C" in output and "AFTER THE STEP" not in output, output
