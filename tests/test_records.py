"""Manifest format 5: a checkpoint of many files keeps its records in a file of their own,
written once by the experiment's owner, read back only when its checksum matches, removed with
its checkpoint, and removed as a leftover where no manifest names it. Pure: no MPI."""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import replace

import pytest

from hpckit import settings
from hpckit.config import CheckpointConfig
from hpckit.errors import ManifestError, ProtocolError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.leftovers import remove_leftovers
from hpckit.experiment.manifest import CheckpointRecord, FileRecord, Manifest
from hpckit.experiment.reading import read_manifest
from hpckit.storage.location import resolve

pytestmark = pytest.mark.quick
CHECKSUM = "xxh3-128:" + "0f" * 16


class Reader:
    """Reads an experiment's files by relative name, and keeps the names it read."""

    def __init__(self, root) -> None:
        self.root, self.names = root, []

    def __call__(self, name: str) -> bytes:
        self.names.append(name)
        return (self.root / name).read_bytes()


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


def node_parts(tmp_path, directory: str, nodes: list[list[FileRecord]],
               plan_shared: dict[str, int] | None = None) -> list:
    """Each node's part written as its leader writes it (``writer.node_part``), its
    leader the node's first rank."""
    from hpckit.run.writing.writer import node_part
    from hpckit.run.writing.plan import Persisted, Plan

    plan = Plan(0, directory=directory, index=int(directory.split("_")[1]),
                shared=plan_shared or {}, by_nodes=True)
    target = resolve(str(tmp_path / "exp" / directory))
    return [node_part(plan, target, tuple(sorted({r.rank for r in files})),
                      [Persisted([r]) for r in files]) for files in nodes]


def commit_by_nodes(experiment: Experiment, tmp_path, index: int, nodes) -> CheckpointRecord:
    from hpckit.experiment.records import indexed

    directory = f"checkpoint_{index:06d}"
    parts = node_parts(tmp_path, directory, nodes)
    reference, data = indexed(directory, index, [node.part(directory) for node in parts])
    committed = CheckpointRecord(index, directory, index, 1.0, {"loss": 1.0}, (),
                                 records=reference)
    experiment.commit(committed, CheckpointConfig(), data)
    return committed


def test_records_written_in_parts_by_the_node_leaders_read_back_whole_and_sorted(tmp_path):
    """Format 8: rank 0 writes only the index of the nodes' parts; the manifest read back
    holds every record, in path order, and a damaged part takes only its checkpoint out of
    use."""
    experiment = experiment_at(tmp_path)
    nodes = [[FileRecord(f"shard-{r}.bin", r, r, CHECKSUM) for r in ranks]
             for ranks in ([0, 1], [2, 3], [4])]
    commit_by_nodes(experiment, tmp_path, 0, nodes)
    commit_by_nodes(experiment, tmp_path, 1, nodes)
    body = json.loads((tmp_path / "exp" / "manifest.json").read_text())
    assert body["format_version"] == 8
    assert body["checkpoints"][0]["records"] == {
        "file": "records/000000.json", "checksum": body["checkpoints"][0]["records"]["checksum"],
        "count": 5, "parts": 3}
    index = json.loads((tmp_path / "exp" / "records" / "000000.json").read_text())
    assert [name for name, _, _ in index["parts"]] == [
        f"checkpoint_000000/.hpckit-records/rank-{leader:06d}.json" for leader in (0, 2, 4)]
    read = read_manifest(resolve(str(tmp_path / "exp")))
    assert [f.path for f in read.checkpoints[0].files] == [f"shard-{r}.bin" for r in range(5)]
    assert [f.rank for f in read.checkpoints[1].files] == list(range(5))
    part = tmp_path / "exp" / "checkpoint_000000" / ".hpckit-records" / "rank-000002.json"
    part.write_text(part.read_text().replace("shard-2", "shard-9"))
    damaged = read_manifest(resolve(str(tmp_path / "exp")))
    assert damaged.checkpoints[0].files == () and "rank-000002.json does not match" in \
        damaged.checkpoints[0].damaged
    assert damaged.checkpoints[1].damaged is None and len(damaged.checkpoints[1].files) == 5


def test_a_manifest_read_reads_no_records_and_one_file_reads_its_nodes_part_first(tmp_path):
    """Reading a manifest reads none of its checkpoints' record files; a checkpoint's files
    read the index and every part; one file looked up by rank reads the index and the part
    of that rank's node, then the others only while it is not found."""
    from hpckit.experiment import encoding

    experiment = experiment_at(tmp_path)
    nodes = [[FileRecord(f"shard-{r}.bin", r, r, CHECKSUM) for r in ranks]
             for ranks in ([0, 1], [2, 3], [4])]
    commit_by_nodes(experiment, tmp_path, 0, nodes)
    commit_by_nodes(experiment, tmp_path, 1, nodes)
    reads: list[str] = []

    def read(name: str) -> bytes:
        reads.append(name)
        return (tmp_path / "exp" / name).read_bytes()

    def manifest() -> Manifest:
        reads.clear()
        found = encoding.from_json((tmp_path / "exp" / "manifest.json").read_bytes(), "m", read)
        assert reads == []
        return found

    part = "checkpoint_000001/.hpckit-records/rank-{:06d}.json".format
    assert manifest().checkpoints[1].file("shard-3.bin", rank=3) == nodes[1][1]
    assert reads == ["records/000001.json", part(2)]
    assert manifest().checkpoints[1].file("shard-4.bin", rank=1) == nodes[2][0]
    assert reads == ["records/000001.json", part(0), part(2), part(4)]
    assert manifest().checkpoints[1].file("absent.bin", rank=4) is None
    assert reads == ["records/000001.json", part(4), part(0), part(2)]  # every part, once
    read_back = manifest().checkpoints[1]
    assert [f.path for f in read_back.files] == [f"shard-{r}.bin" for r in range(5)]
    assert reads == ["records/000001.json", part(0), part(2), part(4)]
    reads.clear()
    assert read_back.file("shard-2.bin", rank=0) == nodes[1][0] and reads == []
    read_first = manifest()
    sent = pickle.dumps([r.read() for r in read_first.checkpoints])  # as a cached one is sent
    assert sorted(reads) == sorted(
        [f"records/00000{i}.json" for i in (0, 1)] + [f"checkpoint_00000{i}/.hpckit-records/"
                                                      f"rank-{n:06d}.json" for i in (0, 1)
                                                      for n in (0, 2, 4)])
    reads.clear()
    assert [len(r.files) for r in pickle.loads(sent)] == [5, 5] and reads == []
    reader = Reader(tmp_path / "exp")  # picklable, as reading.read_manifest's is
    unread = encoding.from_json((tmp_path / "exp" / "manifest.json").read_bytes(), "m", reader)
    received = pickle.loads(pickle.dumps(unread))
    assert reader.names == []  # pickling never reads
    assert [len(r.files) for r in received.checkpoints] == [5, 5] and reader.names == []
    (tmp_path / "exp" / part(2)).write_text("{}")
    damaged = manifest().checkpoints[1]
    assert damaged.file("shard-2.bin", rank=2) is None
    assert "rank-000002.json does not match" in damaged.damaged


def test_an_index_can_name_only_parts_of_records(tmp_path):
    from hpckit.experiment.records import RecordsFile, read_records
    from hpckit.storage.copy import checksum_of

    index = json.dumps({"format": "hpckit.records", "directory": "checkpoint_000000",
                        "parts": [["checkpoint_000000/model.bin", CHECKSUM, 1]]}).encode()
    reference = RecordsFile("records/000000.json", checksum_of(index), 1, 1)
    with pytest.raises(ManifestError, match="is not a part of the checkpoint's records"):
        read_records(reference, {"records/000000.json": index}.__getitem__, "m", lambda _: True)


def test_names_several_ranks_hand_are_kept_once_and_compared_across_nodes(tmp_path):
    """A name every rank hands is in its writer's part only; rank 0 compares every node's
    hash of it (``planning.check_nodes``), and refuses a checkpoint where they differ."""
    from hpckit.errors import CheckpointError
    from hpckit.run.commit.planning import check_nodes
    from hpckit.run.writing.plan import Plan

    other = "xxh3-128:" + "1e" * 16
    alike = [[FileRecord("cfg.json", 2, 0, CHECKSUM), FileRecord("m0.bin", 4, 0, CHECKSUM)],
             [FileRecord("cfg.json", 2, 1, CHECKSUM), FileRecord("m1.bin", 4, 1, CHECKSUM)]]
    parts = node_parts(tmp_path, "checkpoint_000000", alike, {"cfg.json": 0})
    assert [p.records for p in parts] == [2, 1]
    assert [p.size for p in parts] == [6, 4]
    plan = Plan(0, directory="checkpoint_000000", index=0, shared={"cfg.json": 0})
    check_nodes(plan, parts, 2)
    with pytest.raises(ProtocolError, match="cover 1 of 2 ranks"):
        check_nodes(plan, parts[:1], 2)
    differ = [alike[0], [alike[1][0]._replace(checksum=other), alike[1][1]]]
    with pytest.raises(CheckpointError, match="cfg.json"):
        check_nodes(plan, node_parts(tmp_path, "checkpoint_000000", differ, {"cfg.json": 0}), 2)


def test_a_mirror_copies_the_parts_and_every_file_of_records_written_by_nodes(tmp_path):
    """Rank 0 holds none of such a checkpoint's records: the mirror reads them back, copies
    every file and the parts, and the mirror's manifest reads back whole."""
    from hpckit.config import SyncConfig
    from hpckit.experiment.mirror import Mirror

    experiment = experiment_at(tmp_path)
    nodes = [[FileRecord(f"shard-{r}.bin", 3, r, CHECKSUM) for r in ranks] for ranks in ([0], [1])]
    for r in range(2):
        (tmp_path / "exp" / "checkpoint_000000").mkdir(exist_ok=True)
        (tmp_path / "exp" / "checkpoint_000000" / f"shard-{r}.bin").write_bytes(b"abc")
    committed = commit_by_nodes(experiment, tmp_path, 0, nodes)
    assert committed.files == () and experiment.manifest.checkpoints[0].files == ()
    mirror = Mirror(experiment.location, "exp", SyncConfig(mirror=str(tmp_path / "mirror")))
    mirror.close(experiment.manifest)
    assert mirror.failures == 0
    copied = tmp_path / "mirror" / "exp" / "checkpoint_000000"
    assert sorted(p.name for p in copied.iterdir()) == [".hpckit-records", "shard-0.bin",
                                                       "shard-1.bin"]
    read = read_manifest(resolve(str(tmp_path / "mirror" / "exp")))
    assert [f.path for f in read.checkpoints[0].files] == ["shard-0.bin", "shard-1.bin"]


def test_a_checkpoint_handed_again_leaves_its_parts_behind(tmp_path):
    """report(checkpoint=get_checkpoint()) of a checkpoint whose records the node leaders
    wrote: its parts are hpckit's, stale for the new checkpoint, which gets its own."""
    from hpckit.run.writing.shares import list_source

    source = tmp_path / "checkpoint_000003"
    (source / ".hpckit-records").mkdir(parents=True)
    (source / ".hpckit-records" / "rank-000000.json").write_text("{}")
    (source / ".hpckit-resume").mkdir()
    (source / ".hpckit-resume" / "rank-00000").write_text("state")
    (source / "model.pt").write_bytes(b"weights")
    assert list_source(str(source), 0) == [("model.pt", 7)]


def test_a_leader_sends_its_nodes_background_records_once_every_rank_of_it_finished(tmp_path):
    """In the background (``writer.finished_by_node``): while a rank of the node has not
    finished, no rank's records go on to rank 0 and no part is written; once all have, the
    leader writes the part once and sends its summary in its own ``Finished``; a part it
    cannot write is the leader's failure of that checkpoint; a rank's failure goes on."""
    from hpckit.run.mpi.comm import RankFailure
    from hpckit.run.writing.writer import InFlight
    from hpckit.run.writing.plan import REPORT, Announcement, Finished, Persisted, Plan
    from hpckit.run.writing.writer import finished_by_node

    directory = "checkpoint_000000"
    plan = Plan(0, directory=directory, index=0, asynchronous=True, by_nodes=True)
    mine, theirs = (FileRecord(f"shard-{r}.bin", 4, r, CHECKSUM) for r in (4, 5))

    def leader(target) -> InFlight:
        flights = InFlight(4)
        flights.start(directory, resolve(str(target)), lambda: Persisted([mine]), plan)
        flights.wait()
        return flights

    def pairs(flights: InFlight, other: tuple) -> list:
        return [(Announcement(REPORT, 1, finished=flights.finished()), None),
                (Announcement(REPORT, 1, finished=other), None)]

    (tmp_path / directory).mkdir()
    flights = leader(tmp_path / directory)
    waiting = finished_by_node(flights, (4, 5), pairs(flights, ()))
    assert waiting[0][0].finished == (Finished(directory),) and flights.parts == {}
    assert not (tmp_path / directory / ".hpckit-records").exists()
    done = pairs(flights, (Finished(directory, Persisted([theirs])),))
    first, second = finished_by_node(flights, (4, 5), done), finished_by_node(flights, (4, 5), done)
    node = first[0][0].finished[0].node
    assert node is not None and (node.leader, node.ranks, node.records, node.size) == (4, 2, 2, 8)
    assert second[0][0].finished[0].node is node and first[1][0].finished == (Finished(directory),)
    assert (tmp_path / directory / ".hpckit-records" / "rank-000004.json").is_file()
    flights.drop_committed((directory,))
    assert flights.parts == {}
    flights.close()

    (tmp_path / "a-file").write_text("not a directory")
    flights = leader(tmp_path / "a-file")
    failed = finished_by_node(flights, (4, 5), pairs(flights, (Finished(directory, Persisted([theirs])),)))
    assert failed[0][0].finished[0].failure.rank == 4 and failed[1][0].finished == (Finished(directory),)
    broken = RankFailure.capture(5, OSError("disk full"))
    kept = finished_by_node(flights, (4, 5), pairs(flights, (Finished(directory, failure=broken),)))
    assert kept[1][0].finished == (Finished(directory, failure=broken),) and flights.parts == {}
    flights.close()
