"""Manifest serialisation and validation: pure, no MPI."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from hpckit.errors import ManifestError
from hpckit.experiment import encoding
from hpckit.experiment.attempts import Attempt, AttemptStatus
from hpckit.experiment.manifest import CheckpointRecord, FileRecord, Manifest, is_safe_relpath

pytestmark = pytest.mark.quick


def sample() -> Manifest:
    rec = CheckpointRecord(3, "checkpoint_000003", 7, 1.5, {"loss": 0.25},
                           (FileRecord("model-rank=1.pt", 10, 1, "sha256:" + "ab" * 32),))
    return Manifest("exp", 4, {"argv": ["train.py"]}, {"a": 1}, {"num_to_keep": 2}, 1.0,
                    (rec,), 4, 8, (Attempt(0, AttemptStatus.FINISHED, 1.0, 4, "mpiexec"),))


def test_round_trip_is_exact():
    m = sample()
    text = encoding.to_json(m)
    assert encoding.from_json(text, "x") == m
    body = json.loads(text)
    assert body["format"] == "hpckit.manifest" and body["format_version"] == 3
    assert body["latest"] == "checkpoint_000003"
    assert json.loads(encoding.to_json(replace(m, checkpoints=())))["format_version"] == 1, \
        "a manifest without checkpoints is one every hpckit reads"


@pytest.mark.parametrize("edit,fragment", [
    (lambda b: b.pop("world_size"), "field world_size: missing"),
    (lambda b: b.update(checkpoints={}), "field checkpoints: expected list"),
    (lambda b: b["checkpoints"][0].update(index="3"), "checkpoints[0].index: expected int"),
    (lambda b: b["checkpoints"][0].update(directory="../../etc"), "is not checkpoint_000003"),
    (lambda b: b["checkpoints"][0]["files"][0].update(path="../x"), "leaves the checkpoint"),
    (lambda b: b["checkpoints"][0]["files"][0].update(path="/etc/passwd"), "leaves the checkpoint"),
    (lambda b: b["checkpoints"][0]["files"][0].update(size=None), "files[0].size: expected int"),
    (lambda b: b["checkpoints"].append(dict(b["checkpoints"][0])), "lists an index twice"),
    (lambda b: b.update(format="other"), "is not an hpckit manifest"),
    (lambda b: b["checkpoints"][0]["files"][0].update(checksum="md5:00"), "a newer hpckit"),
    (lambda b: b["checkpoints"][0]["files"][0].update(checksum="sha256:zz"), "not a sha256 digest"),
    (lambda b: b["checkpoints"][0]["files"][0].pop("checksum"), "files[0].checksum: missing"),
])
def test_invalid_fields_are_named(edit, fragment):
    body = json.loads(encoding.to_json(sample()))
    edit(body)
    with pytest.raises(ManifestError) as info:
        encoding.from_json(json.dumps(body), "/x/manifest.json")
    assert fragment in str(info.value) and "/x/manifest.json" in str(info.value)


@pytest.mark.parametrize("path,ok", [("a.pt", True), ("d/a.pt", True), ("../a", False),
                                     ("/a", False), ("a/../b", False), ("", False),
                                     ("a//b", False), ("./a", False), ("a\\b", False)])
def test_safe_relative_paths(path, ok):
    assert is_safe_relpath(path) is ok


def test_a_manifest_read_while_a_run_replaces_it_is_read_again(tmp_path, monkeypatch):
    """pyarrow reads an object's size (HEAD), then its bytes (GET): a commit in between cuts
    the new manifest at the old size. That cannot be timed against a real server, so the cut
    read is made here; a manifest that stays damaged still raises."""
    from hpckit.experiment import reading
    from hpckit.storage import files
    from hpckit.storage.location import local

    body = encoding.to_json(sample()).encode()
    (tmp_path / "manifest.json").write_bytes(body)
    reads = []

    def cut_once(location):
        reads.append(location)
        return body[: len(body) // 2] if len(reads) == 1 else body

    monkeypatch.setattr(files, "read_bytes", cut_once)
    assert reading.read_manifest(local(str(tmp_path))) is not None and len(reads) == 2
    monkeypatch.setattr(files, "read_bytes", lambda location: body[:10])
    with pytest.raises(ManifestError, match="not valid JSON"):
        reading.read_manifest(local(str(tmp_path)))


def _record(*files: tuple[str, int]) -> CheckpointRecord:
    return CheckpointRecord(0, "checkpoint_000000", 0, 0.0, {},
                            tuple(FileRecord(path, 1, rank, "xxh3-128:0") for path, rank in files))


def test_another_world_size_takes_rank0_files_and_dcp_and_refuses_other_shards():
    from hpckit.experiment.opening import resize_refusal as refusal

    dcp = _record(("model/.metadata", 0), ("model/__0_0.distcp", 0), ("model/__1_0.distcp", 1),
                  ("extra.pt", 0))
    assert refusal(dcp, 2, 3) is None, "load_state_dcp reshards DCP checkpoints"
    assert refusal(_record(("model.pt", 0), ("meta.json", 0)), 2, 3) is None
    shards = _record(("state-rank0.npy", 0), ("state-rank1.npy", 1))
    said = refusal(shards, 2, 3)
    assert said and "ranks [0, 1]" in said and "Use -n 2" in said
    assert refusal(shards, 2, 2) is None and refusal(None, 2, 3) is None
    stray = _record(("model/.metadata", 0), ("model/__1_0.distcp", 1), ("opt-rank1.pt", 1))
    assert refusal(stray, 2, 3), "a per-rank file beside DCP's still needs the same world"


def test_every_reserved_name_is_named_by_the_error_and_the_docs():
    """A name hpckit keeps for itself is refused as a checkpoint_dir_name with the whole list,
    and docs/checkpoints.md lists the same names."""
    from pathlib import Path

    from hpckit.experiment.manifest import RESERVED_NAMES, custom_dirname_problem

    page = (Path(__file__).resolve().parent.parent / "docs" / "checkpoints.md").read_text()
    listed = re.search(r"not one of hpckit's own \(([^)]*)\)", page.replace("\n", " "))
    assert listed is not None
    for name in RESERVED_NAMES:
        assert f"`{name}`" in listed[1], f"docs/checkpoints.md does not list {name}"
        problem = custom_dirname_problem(name) if name[0].isalnum() else None
        if problem is not None:
            assert all(other in problem for other in RESERVED_NAMES), problem


def test_files_of_unknown_writers_are_refused_at_another_size_but_dcp_is_not():
    """A file written in place by one of several ranks that handed the directory (rank None)
    may be a per-rank shard: another world size is refused, saying why and how to let rank 0
    alone write; DCP's files are resharded whoever hashed its .metadata."""
    from hpckit.experiment.opening import resize_refusal as refusal

    said = refusal(_record(("model.pt", None), ("optim.pt", None)), 2, 3)
    assert said and "cannot tell which rank wrote them" in said and "Use -n 2" in said
    assert "model.pt" in said and "checkpoint=None on the other ranks" in said
    assert refusal(_record(("model/.metadata", None), ("model/__0_0.distcp", None),
                           ("model/__1_0.distcp", None)), 2, 3) is None
    assert refusal(_record(("model/.metadata", 1), ("model/__0_0.distcp", 0)), 2, 3) is None
    assert refusal(_record(("model.pt", 0), ("optim.pt", 0)), 2, 3) is None
