"""Manifest format 5: a checkpoint of many files keeps its records in a file of their own,
written once by the experiment's owner, read back only when its checksum matches, removed with
its checkpoint, and removed as a leftover where no manifest names it. Pure: no MPI."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from hpckit import settings
from hpckit.config import CheckpointConfig
from hpckit.errors import ManifestError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.leftovers import remove_leftovers
from hpckit.experiment.manifest import CheckpointRecord, FileRecord, Manifest
from hpckit.experiment.reading import read_manifest
from hpckit.storage.location import resolve

pytestmark = pytest.mark.quick
CHECKSUM = "xxh3-128:" + "0f" * 16


def record(index: int, files: int) -> CheckpointRecord:
    return CheckpointRecord(index, f"checkpoint_{index:06d}", index, 1.0 + index, {"loss": 1 / (index + 1)},
                            tuple(FileRecord(f"shard-{i}.bin", i, i % 7, CHECKSUM)
                                  for i in range(files)))


def experiment_at(tmp_path) -> Experiment:
    location = resolve(str(tmp_path / "exp"))
    manifest = Manifest("exp", 7, {"argv": ["train.py"]}, {}, {}, 1.0)
    (tmp_path / "exp").mkdir()
    return Experiment(location, manifest)


def test_a_checkpoint_of_many_files_keeps_its_records_apart_and_reads_back_whole(tmp_path):
    experiment = experiment_at(tmp_path)
    experiment.commit(record(0, 1001), CheckpointConfig())
    experiment.commit(record(1, 3), CheckpointConfig())
    body = json.loads((tmp_path / "exp" / "manifest.json").read_text())
    assert body["format_version"] == 5
    apart, inline = body["checkpoints"]
    assert "files" not in apart and apart["records"]["file"] == "records/000000.json"
    assert apart["records"]["count"] == 1001 and len(inline["files"]) == 3
    assert (tmp_path / "exp" / "records" / "000000.json").is_file()
    assert not (tmp_path / "exp" / "records" / "000001.json").exists()
    read = read_manifest(resolve(str(tmp_path / "exp")))
    assert read == experiment.manifest and len(read.checkpoints[0].files) == 1001


def test_a_damaged_or_missing_record_file_takes_only_its_checkpoint_out_of_use(tmp_path):
    """#51, item 9: the manifest still reads; the checkpoint says why it cannot be used, and
    a later commit keeps its reference as it was."""
    experiment = experiment_at(tmp_path)
    experiment.commit(record(0, 1001), CheckpointConfig())
    experiment.commit(record(1, 2), CheckpointConfig())
    path = tmp_path / "exp" / "records" / "000000.json"
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    damaged, whole = read_manifest(resolve(str(tmp_path / "exp"))).checkpoints
    assert damaged.files == () and damaged.damaged is not None
    assert re.fullmatch(r"its records cannot be used: records/000000\.json does not match the "
                        r"checksum .*; restore it from a backup\. The other checkpoints are "
                        r"unaffected\.", damaged.damaged), damaged.damaged
    assert whole == experiment.manifest.checkpoints[1] and whole.damaged is None
    path.unlink()
    damaged = read_manifest(resolve(str(tmp_path / "exp"))).checkpoints[0]
    assert damaged.damaged == "its records cannot be used: records/000000.json is missing"
    reopened = Experiment(experiment.location, read_manifest(experiment.location))
    reopened.commit(record(2, 1), CheckpointConfig())
    body = json.loads((tmp_path / "exp" / "manifest.json").read_text())
    assert body["checkpoints"][0]["records"] == \
        json.loads(json.dumps(experiment.manifest.checkpoints[0].records.to_json()))
    assert "damaged" not in body["checkpoints"][0]


def test_a_manifest_cannot_point_at_another_file(tmp_path):
    experiment = experiment_at(tmp_path)
    experiment.commit(record(0, 1001), CheckpointConfig())
    manifest = tmp_path / "exp" / "manifest.json"
    body = json.loads(manifest.read_text())
    body["checkpoints"][0]["records"]["file"] = "../../etc/passwd"
    manifest.write_text(json.dumps(body))
    with pytest.raises(ManifestError, match=r"is not 'records/000000\.json'"):
        read_manifest(resolve(str(tmp_path / "exp")))


def test_eviction_gc_and_resume_remove_record_files_no_manifest_names(tmp_path):
    experiment = experiment_at(tmp_path)
    records = tmp_path / "exp" / "records"
    for index in range(3):
        experiment.commit(record(index, 1001), CheckpointConfig(num_to_keep=2))
    experiment.wait_for_purge()
    assert sorted(p.name for p in records.iterdir()) == ["000001.json", "000002.json"]
    (records / "000007.json").write_bytes(b"a commit killed before its manifest")
    garbage = experiment.collect_garbage(None, dry_run=False)
    assert garbage.leftovers == {"records/000007.json": 35}
    assert sorted(p.name for p in records.iterdir()) == ["000001.json", "000002.json"]
    garbage = experiment.collect_garbage(1, dry_run=False)
    assert [r.directory for r in garbage.evicted] == ["checkpoint_000001"]
    assert [p.name for p in records.iterdir()] == ["000002.json"]
    (records / ".000009.json.tmp-0123abcd").write_bytes(b"cut short")
    assert remove_leftovers(experiment.location, experiment.manifest) == \
        ["records/.000009.json.tmp-0123abcd"]
    assert read_manifest(experiment.location) == experiment.manifest


def test_the_threshold_is_a_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCKIT_INLINE_RECORDS", "0")
    monkeypatch.setattr(settings, "_current", settings.Settings.read())
    experiment = experiment_at(tmp_path)
    experiment.commit(record(0, 1), CheckpointConfig())
    assert experiment.manifest.checkpoints[0].records is not None
    assert read_manifest(experiment.location) == experiment.manifest


def test_a_file_of_an_unknown_writer_is_kept_inline_and_apart_and_needs_format_6(tmp_path):
    """A file written in place by one of several ranks that handed the directory has no
    known writer (rank null): kept inline or apart, it reads back as None, and the manifest
    is format 6, which an hpckit that reads up to 5 refuses ("upgrade hpckit") instead of
    taking null for a damaged record."""
    experiment = experiment_at(tmp_path)
    unknown = FileRecord("part-1.bin", 5, None, CHECKSUM)
    experiment.commit(CheckpointRecord(0, "checkpoint_000000", 0, 1.0, {}, (unknown,)),
                      CheckpointConfig())
    body = json.loads((tmp_path / "exp" / "manifest.json").read_text())
    assert body["format_version"] == 6 and body["checkpoints"][0]["files"][0]["rank"] is None
    many = record(1, 1001)
    experiment.commit(replace(many, files=(unknown, *many.files[1:])), CheckpointConfig())
    read = read_manifest(resolve(str(tmp_path / "exp")))
    assert read == experiment.manifest
    assert [c.files[0].rank for c in read.checkpoints] == [None, None]
