"""`hpckit run` and `hpckit resume` with an experiment on a real S3 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import HERE, HPCKIT, JOB, MPIEXEC, STEADY, final_params, run
from support.s3_server import SECRET_KEY

SWEEP = HERE / "ranks" / "sweep.py"


def _manifest(s3, name: str) -> dict:
    return json.loads(s3.read_text(f"{name}/manifest.json"))


def test_hpckit_run_commits_every_rank_shard_to_s3(s3):
    out = run([HPCKIT, "run", "-n", "3", str(JOB), "--storage", s3.uri("runs"), "--name", "shards",
               "--epochs", "2", "--checkpoint", "shards"], timeout=120)
    m = _manifest(s3, "runs/shards")
    assert m["latest"] == "checkpoint_000001"
    assert {f["rank"] for f in m["checkpoints"][-1]["files"]} == {0, 1, 2}
    data = s3.filesystem().open_input_stream("hpckit/runs/shards/checkpoint_000001/model-rank=2.pt").read()
    assert data == bytes([2]) * 1000
    assert SECRET_KEY not in out.output and SECRET_KEY not in json.dumps(m)
    assert m["config"]["storage_path"].startswith("s3://***@hpckit/runs")


def test_stopped_s3_run_resumes_with_hpckit_resume(s3, steady_reference, tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(STEADY), "--workers", "2", "--storage", s3.uri("runs"), "--name", "stop",
         "--epoch-seconds", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, cwd=tmp_path)
    fs = s3.filesystem()
    try:
        deadline = time.monotonic() + 90
        while fs.get_file_info("hpckit/runs/stop/checkpoint_000001").type.name == "NotFound":
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
            time.sleep(0.2)
        process.send_signal(signal.SIGUSR2)
        first, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 75, first
    out = run([HPCKIT, "resume", s3.uri("runs/stop")], timeout=120)
    assert final_params(out.output) == steady_reference
    m = _manifest(s3, "runs/stop")
    assert [a["status"] for a in m["attempts"]] == ["stopped", "finished"]
    assert [json.loads(l)["metrics"]["epoch"] for l in s3.read_text("runs/stop/metrics.jsonl").splitlines()] == list(range(8))
    assert SECRET_KEY not in first + out.output


def _never_train():
    raise AssertionError("training started despite bad storage")


def test_wrong_credentials_are_a_clear_error_before_training(s3):
    from hpckit import RunConfig, StorageError
    from hpckit.torch import TorchTrainer

    uri = s3.uri("creds").replace(SECRET_KEY, "not-the-secret")
    with pytest.raises(StorageError) as info:
        TorchTrainer(_never_train, run_config=RunConfig(name="e", storage_path=uri)).fit()
    message = str(info.value)
    assert "refused the credentials" in message and "s3://***@hpckit/creds" in message
    assert "not-the-secret" not in message


def test_a_missing_bucket_is_named(s3):
    from hpckit import RunConfig, StorageError
    from hpckit.torch import TorchTrainer

    uri = s3.uri("runs").replace("@hpckit/", "@no-such-bucket/")
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist; create it first"):
        TorchTrainer(_never_train, run_config=RunConfig(name="e", storage_path=uri)).fit()
    assert s3.filesystem().get_file_info("no-such-bucket").type.name == "NotFound"


def test_a_sweep_on_s3_keeps_its_manifest_and_every_trial_there_and_resumes(s3):
    """tests/ranks/sweep.py packed on 2 ranks with storage on S3: sweep.json and each trial's
    experiment are objects there, one trial failed beside two finished, `hpckit ls` reads
    it from S3, and a rerun finds nothing to run (failed trials rerun only when asked)."""
    sweep = [MPIEXEC, "-n", "2", sys.executable, str(SWEEP), "--storage", s3.uri("sweeps"),
             "--fail-lr", "0.2"]
    out = run(sweep, timeout=180)
    recorded = json.loads(s3.read_text("sweeps/grid/sweep.json"))
    assert [t["status"] for t in recorded["trials"]] == ["TERMINATED", "ERROR", "TERMINATED"]
    for trial in recorded["trials"]:
        attempts = _manifest(s3, f"sweeps/grid/{trial['dirname']}")["attempts"]
        assert [a["status"] for a in attempts] == (
            ["failed"] if trial["status"] == "ERROR" else ["finished"]), (trial, out.output)
    assert SECRET_KEY not in out.output and SECRET_KEY not in json.dumps(recorded)
    listed = run([HPCKIT, "ls", s3.uri("sweeps/grid")], timeout=60)
    assert listed.output.splitlines()[-1] == "3 trial(s): 2 finished, 1 failed", listed.output
    again = run(sweep, timeout=180)
    assert "3 trial(s), 0 to run" in again.output, again.output
