"""report() on real MPI ranks: what ends up on disk and in the manifest."""

from __future__ import annotations

import re

import pytest
from conftest import checkpoint_dirs, manifest, metrics_lines, mpiexec

from hpckit.storage.copy import checksum_of

pytestmark = pytest.mark.quick


def test_every_rank_shard_is_committed_with_size_rank_and_checksum(tmp_path, world):
    run = mpiexec(world, "--storage", str(tmp_path), "--checkpoint", "shards", "--epochs", "2",
                  "--shard-bytes", "3000")
    exp = tmp_path / "exp"
    m = manifest(exp)
    assert [c["directory"] for c in m["checkpoints"]] == ["checkpoint_000000", "checkpoint_000001"]
    assert m["latest"] == "checkpoint_000001" and m["world_size"] == world
    for record in m["checkpoints"]:
        files = {f["path"]: f for f in record["files"]}
        assert set(files) == {f"model-rank={r}.pt" for r in range(world)} | {"state.json"}
        for r in range(world):
            f = files[f"model-rank={r}.pt"]
            data = (exp / record["directory"] / f["path"]).read_bytes()
            assert f["rank"] == r and f["size"] == 3000 == len(data)
            assert f["checksum"] == checksum_of(data) and f["checksum"].startswith("xxh3-128:")
            assert data == bytes([r]) * 3000
    assert [line["step"] for line in metrics_lines(exp)] == [0, 1]
    assert run.result["checkpoint"] == str(exp / "checkpoint_000001")


@pytest.mark.parametrize("world", [2, 3])
def test_identical_files_from_several_ranks_are_stored_once(tmp_path, world):
    mpiexec(world, "--storage", str(tmp_path), "--checkpoint", "none", "--collide", "identical",
            "--epochs", "1")
    record = manifest(tmp_path / "exp")["checkpoints"][0]
    assert sorted(f["path"] for f in record["files"]) == ["common.bin", "state.json"]
    assert all(f["rank"] == 0 for f in record["files"])


def test_different_contents_under_one_name_fail_on_every_rank(tmp_path):
    run = mpiexec(3, "--storage", str(tmp_path), "--checkpoint", "none", "--collide", "different",
                  "--epochs", "2", expect=None)
    assert run.returncode != 0
    # mpiexec forwards each rank's output in chunks, so lines of two ranks may be glued.
    failed = set(re.findall(r"\[(\d+)\] ERROR WorkerGroupError: [^\n\[]*common\.bin", run.output))
    assert failed == {"0", "1", "2"}, run.output
    assert "ranks 0, 1" in run.output and "different contents" in run.output
    exp = tmp_path / "exp"
    assert manifest(exp)["checkpoints"] == [] and checkpoint_dirs(exp) == []


@pytest.mark.parametrize("world", [1, 3])
def test_reports_without_checkpoint_append_metrics_only(tmp_path, world):
    mpiexec(world, "--storage", str(tmp_path), "--checkpoint", "none", "--epochs", "3")
    exp = tmp_path / "exp"
    assert checkpoint_dirs(exp) == [] and manifest(exp)["checkpoints"] == []
    lines = metrics_lines(exp)
    assert [(l["step"], l["checkpoint"], l["metrics"]["epoch"]) for l in lines] == [
        (0, None, 0), (1, None, 1), (2, None, 2)]


@pytest.mark.parametrize("world", [1, 4])
def test_retention_keeps_the_best_and_the_latest_on_disk(tmp_path, world):
    # score by epoch: 3 1 4 1 5 9 2 -> keep the 2 highest (9 at epoch 5, 5 at 4) + latest (6).
    mpiexec(world, "--storage", str(tmp_path), "--epochs", "7", "--keep", "2", "--score", "score")
    exp = tmp_path / "exp"
    kept = ["checkpoint_000004", "checkpoint_000005", "checkpoint_000006"]
    assert checkpoint_dirs(exp) == kept
    assert [c["directory"] for c in manifest(exp)["checkpoints"]] == kept


def test_metrics_that_are_not_json_fail_naming_the_key(tmp_path):
    run = mpiexec(2, "--storage", str(tmp_path), "--metrics", "bad", expect=3)
    assert "metric 'model'" in run.output and "object" in run.output
    assert checkpoint_dirs(tmp_path / "exp") == []
