"""``Result.path`` and ``Checkpoint.path`` are paths on their ``filesystem``, as in Ray: a Ray
program lists its experiment with ``result.filesystem.get_file_info(FileSelector(result.path))``
on local storage and on S3, and the strings are the same whether the run was started by
``python train.py``, under ``mpiexec``, or read back with ``Result.from_path``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import HERE, HPCKIT, mpiexec, python, run
from support.s3_server import BUCKET, SECRET_KEY

from hpckit import DataParallelTrainer, Result, RunConfig

PATHS = HERE / "ranks" / "paths.py"


def _check_every_launch_mode(storage: str, expected: str) -> None:
    spawned = python("--storage", storage, "--workers", "2", "--epochs", "2", script=PATHS)
    launched = mpiexec(3, "--storage", storage, "--workers", "3", "--epochs", "3", script=PATHS)
    first, second = spawned.result, launched.result
    assert first["path"] == second["path"] == expected
    assert first["checkpoint"] == f"{expected}/checkpoint_000001" and first["epoch"] == "1"
    assert second["checkpoint"] == f"{expected}/checkpoint_000002" and second["epoch"] == "2"
    assert {"manifest.json", "metrics.jsonl", "checkpoint_000002"} <= set(second["listed"])
    assert all(path.startswith(f"{expected}/checkpoint_") for path in second["best"])
    context = json.loads(launched.line("CONTEXT"))
    assert context == {"experiment": expected, "storage": expected.rsplit("/", 1)[0]}
    assert SECRET_KEY not in spawned.output + launched.output
    again = Result.from_path(storage.replace("?", "/paths?", 1) if "?" in storage
                             else os.path.join(storage, "paths"))
    assert again.path == expected and again.checkpoint is not None
    assert again.checkpoint.path == second["checkpoint"]


def test_local_paths_are_absolute_and_the_same_in_every_launch_mode(tmp_path):
    _check_every_launch_mode(str(tmp_path / "runs"), str(tmp_path / "runs" / "paths"))


def test_s3_paths_are_bucket_keys_usable_with_the_filesystem(s3, tmp_path):
    prefix = f"paths-{tmp_path.name}"
    _check_every_launch_mode(s3.uri(prefix), f"{BUCKET}/{prefix}/paths")


def _one_big_checkpoint(experiment_root: str, size: int) -> None:
    def loop() -> None:
        import tempfile

        import hpckit

        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "big.bin"), "wb") as f:
                f.truncate(size)
            hpckit.report({"loss": 1.0}, checkpoint=hpckit.Checkpoint.from_directory(d))

    DataParallelTrainer(loop, run_config=RunConfig(name="big", storage_path=experiment_root)).fit()


@pytest.mark.timeout(300)
def test_export_of_a_one_gib_file_to_s3_keeps_memory_bounded(s3, tmp_path):
    size = 1 << 30
    _one_big_checkpoint(str(tmp_path / "runs"), size)
    target = s3.uri(f"export-{tmp_path.name}")
    measure = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
               "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "sys.exit(code)")
    out = run([sys.executable, "-c", measure, HPCKIT, "export", str(tmp_path / "runs" / "big"),
               target], timeout=240)
    peak_mib = int(out.line("PEAK_KIB")) / 1024
    assert "exported checkpoint_000000 (1 file(s), 1073741824 B, verified)" in out.output
    listed = s3.filesystem().get_file_info(f"{BUCKET}/export-{tmp_path.name}/big.bin")
    assert listed.size == size
    print(f"hpckit export: peak RSS {peak_mib:.0f} MiB for a 1 GiB file to S3")
    assert peak_mib < 300, f"hpckit export held {peak_mib:.0f} MiB for a 1 GiB file"


def test_a_storage_error_in_the_cli_is_one_line_with_its_exit_status(s3):
    wrong = s3.uri("anything").replace(SECRET_KEY, "not-the-secret")
    out = subprocess.run([HPCKIT, "ls", wrong], capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 3 and len(lines) == 1, out.stderr
    assert lines[0].startswith("hpckit: error: ") and "refused the credentials" in lines[0]
    assert "Traceback" not in out.stderr and "not-the-secret" not in out.stderr
