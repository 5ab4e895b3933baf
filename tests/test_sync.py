"""Artifacts and mirrors (SyncConfig), on a local directory and on the S3 server."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import HERE, manifest, mpiexec

from hpckit.experiment import encoding
from hpckit.experiment import verify as _verify
from hpckit.storage.location import resolve

SHARDED = HERE / "ranks" / "sharded.py"


def sharded(storage: str, *extra: str, epochs: int = 4, ranks: int = 3):
    return mpiexec(ranks, "--storage", storage, "--epochs", str(epochs), "--keep", "2", *extra,
                   script=SHARDED, timeout=120)


def test_rank0_artifacts_are_persisted_incrementally_and_the_local_copy_removed(tmp_path):
    out = sharded(str(tmp_path), "--artifacts", "rank0")
    stored = tmp_path / "exp" / "artifacts"
    assert sorted(p.name for p in stored.iterdir()) == ["rank-0"]
    log = (stored / "rank-0" / "log.txt").read_text().splitlines()
    assert [line.split()[1] for line in log] == ["0", "1", "2", "3"]
    stamps = re.findall(r"STORED_FIXED (\d+)", out.output)
    assert len(stamps) == 4 and len(set(stamps)) == 1, f"an unchanged file was sent again: {stamps}"
    local = re.search(r"ARTIFACT_DIR (\S+)", out.output).group(1)
    assert not os.path.exists(local), "the local artifact directory outlived the run"


def test_every_ranks_artifacts_on_s3_when_asked(s3):
    sharded(s3.uri("sync"), "--artifacts", "all", epochs=2)
    for rank in range(3):
        text = s3.read_text(f"sync/exp/artifacts/rank-{rank}/fixed.txt")
        assert text == f"written once by rank {rank}\n"
        assert len(s3.read_text(f"sync/exp/artifacts/rank-{rank}/log.txt").splitlines()) == 2


def check_mirror(source, mirror) -> None:
    """The mirror is a consistent copy: same manifest, every kept checkpoint verifies there,
    nothing evicted left behind."""
    copied = encoding.from_json(mirror_read(mirror, "exp/manifest.json"), "mirror")
    assert encoding.to_json(copied) == encoding.to_json(
        encoding.from_json((source / "manifest.json").read_bytes(), "s"))
    location = resolve(mirror_uri(mirror, "exp"))
    for record in copied.checkpoints:
        assert _verify.verify(location, record) == [], record.directory


def mirror_uri(mirror, path: str) -> str:
    if isinstance(mirror, str):
        base, _, query = mirror.partition("?")
        return f"{base}/{path}?{query}"
    return str(mirror / path)


def mirror_read(mirror, path: str) -> bytes:
    location = resolve(mirror_uri(mirror, path))
    with location.filesystem.open_input_stream(location.path) as f:
        return f.read()


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_mirror_holds_the_kept_checkpoints_metrics_and_manifest(tmp_path, backend, request):
    mirror = tmp_path / "mirror" if backend == "local" else request.getfixturevalue("s3").uri(
        f"mirror-{tmp_path.name}")
    out = sharded(str(tmp_path / "scratch"), "--mirror", str(mirror), "--sync-period", "0")
    check_mirror(tmp_path / "scratch" / "exp", mirror)
    assert mirror_read(mirror, "exp/metrics.jsonl") == (tmp_path / "scratch" / "exp" /
                                                        "metrics.jsonl").read_bytes()
    if backend == "local":
        assert sorted(p.name for p in (mirror / "exp").glob("checkpoint_*")) == \
            [c["directory"] for c in manifest(tmp_path / "scratch" / "exp")["checkpoints"]]
    assert "mirrored" in out.output


def test_the_period_limits_mirrors_and_the_end_always_mirrors(tmp_path):
    out = sharded(str(tmp_path / "scratch"), "--mirror", str(tmp_path / "mirror"),
                  "--sync-period", "3600", epochs=5)
    assert len(re.findall(r"mirrored \S+ to \S+ in", out.output)) == 2, out.output
    check_mirror(tmp_path / "scratch" / "exp", tmp_path / "mirror")


def test_a_mirror_command_copies_instead(tmp_path):
    command = "mkdir -p {target} && cp -r {source}/. {target}"
    sharded(str(tmp_path / "scratch"), "--mirror", str(tmp_path / "mirror"), "--mirror-command",
            command, "--sync-period", "0", epochs=2)
    assert json.loads((tmp_path / "mirror" / "exp" / "manifest.json").read_text())["latest"] == \
        "checkpoint_000001"


def test_a_failing_mirror_warns_and_never_fails_training(tmp_path):
    out = sharded(str(tmp_path / "scratch"), "--mirror", str(tmp_path / "mirror"),
                  "--mirror-command", "echo no route to {target} >&2; false {source}",
                  "--sync-period", "0", epochs=3)
    assert out.line("FINAL") is not None
    assert re.search(r"mirror to \S+ failed \(training goes on.*no route to", out.output), out.output
    assert manifest(tmp_path / "scratch" / "exp")["latest"] == "checkpoint_000002"
