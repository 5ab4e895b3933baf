"""A hostile or damaged experiment never makes hpckit read, write or delete outside it:
manifests naming paths out of the experiment, symbolic links out of it, and checkpoint file
names from ranks that try to escape."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import HERE, HPCKIT, checkpoint_dirs, mpiexec, run

from hpckit.errors import CheckpointError
from hpckit.run.commit.planning import assign_writers as _assign_writers

SHARDED = HERE / "ranks" / "sharded.py"


def sharded(storage, epochs: int, expect: int | None = 0):
    return mpiexec(3, "--storage", str(storage), "--epochs", str(epochs), "--keep", "2",
                   script=SHARDED, expect=expect, timeout=90)


def snapshot(directory) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_checkpoint_directories_linked_out_of_the_experiment_are_never_followed(tmp_path):
    sharded(tmp_path / "s", 3)
    exp = tmp_path / "s" / "exp"
    outside = tmp_path / "outside"
    # Identical copies, so that checksums alone would accept them.
    for name in ("checkpoint_000001", "checkpoint_000002"):
        shutil.copytree(exp / name, outside / name)
        shutil.rmtree(exp / name)
        os.symlink(outside / name, exp / name)
    before = snapshot(outside)
    out = sharded(tmp_path / "s", 5)
    text = re.sub(r"\[\d+\] ", "", out.output)
    assert "checkpoint_000002 is a symbolic link out of" in text, text
    assert re.search(r"resuming experiment \S+ from its start", text), text
    assert snapshot(outside) == before, "hpckit changed files outside the experiment"
    assert not any(p.is_symlink() for p in exp.iterdir()), "the links were not removed"


def test_a_file_linked_out_of_a_checkpoint_is_not_read(tmp_path):
    sharded(tmp_path / "s", 3)
    exp = tmp_path / "s" / "exp"
    outside = tmp_path / "secret.npy"
    shutil.copy(exp / "checkpoint_000002" / "state-rank1.npy", outside)
    (exp / "checkpoint_000002" / "state-rank1.npy").unlink()
    os.symlink(outside, exp / "checkpoint_000002" / "state-rank1.npy")
    check = run([HPCKIT, "verify", str(exp)], timeout=60, expect=1)
    assert "state-rank1.npy: a symbolic link out of the experiment directory" in check.output
    before = snapshot(tmp_path / "s"), outside.read_bytes()
    out = sharded(tmp_path / "s", 5)
    assert re.search(r"checkpoint_000002 is DAMAGED .*symbolic link", out.output), out.output
    assert re.search(r"resuming experiment \S+ from checkpoint_000001", out.output), out.output
    assert outside.read_bytes() == before[1] and outside.exists()


@pytest.mark.parametrize("field,value,fragment", [
    ("directory", "../../victim", "is not checkpoint_000002"),
    ("directory", "/tmp/victim", "is not checkpoint_000002"),
    ("path", "../../../victim/file", "leaves the checkpoint"),
    ("path", "/etc/hostname", "leaves the checkpoint"),
    ("size", "12", "files[0].size: expected int"),
])
def test_a_manifest_naming_paths_outside_is_refused_and_nothing_changes(tmp_path, field, value,
                                                                          fragment):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file").write_text("keep me")
    sharded(tmp_path / "s", 3)
    exp = tmp_path / "s" / "exp"
    body = json.loads((exp / "manifest.json").read_text())
    record = body["checkpoints"][-1]
    if field == "directory":
        record["directory"] = value
    else:
        record["files"][0][field] = value
    (exp / "manifest.json").write_text(json.dumps(body))
    before = snapshot(tmp_path)
    out = sharded(tmp_path / "s", 5, expect=None)
    assert out.returncode != 0
    assert "ManifestError" in out.output and fragment in out.output, out.output
    assert str(exp / "manifest.json") in out.output
    assert snapshot(tmp_path) == before
    assert checkpoint_dirs(exp) == ["checkpoint_000001", "checkpoint_000002"]


@pytest.mark.parametrize("name", ["../escape.pt", "/etc/passwd", "a/../../b", "./x"])
def test_checkpoint_file_names_that_leave_the_checkpoint_are_refused(name):
    with pytest.raises(CheckpointError, match=re.escape(f"rank 1 handed checkpoint file {name!r}")):
        _assign_writers({0: [("ok.pt", 3)], 1: [(name, 3)]})
