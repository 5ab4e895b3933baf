"""Multi-level checkpoints (CheckpointConfig(cache_dir, persist_every, redundancy)): cached on
each node, copied to a partner node, every Nth and the last one on storage_path; a restart
from the fastest level that is complete. The multi-node tests run several "nodes" on this
machine (tests/support/cluster_nodes.py): each its own hostname and node-local disk."""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from support.cluster_nodes import Nodes as Cluster
from support.cluster_nodes import nodes  # noqa: F401  (the fixture)
from conftest import HPCKIT, manifest, metrics_lines, mpiexec, run
from mpi4py import MPI
from support.once import computed_once

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, UserCallback
from hpckit.config import CheckpointConfig
from hpckit.errors import CheckpointError, ConfigError
from hpckit.experiment import encoding
from hpckit.experiment.manifest import (
    CACHE,
    STORAGE,
    CheckpointRecord,
    FileRecord,
    Manifest,
    checkpoint_dirname,
)
from hpckit.run.levels.levels import NodeCache, Nodes
from hpckit.run.levels.levels import Levels
from hpckit.run.mpi import transfer
from hpckit.run.mpi.transfer import Receive, Send, exchange
from hpckit.run.writing.plan import Placement, Plan
from hpckit.storage.copy import checksum_of
from hpckit.storage.location import local

SHARDED = Path(__file__).parent / "ranks" / "sharded.py"
QUICK = {"HPCKIT_TENSORBOARD": "0"}
EPOCHS = 7  # checkpoints 0..6; with persist_every=3, 2 and 5 go to storage_path, 6 at the end
TWO = ["nodea", "nodeb"]


def cached_args(storage: Path, cache: Path) -> list[str]:
    return ["--storage", str(storage), "--epochs", str(EPOCHS), "--keep", "3", "--shard-floats",
            "2048", "--cache", str(cache), "--persist-every", "3", "--redundancy", "partner"]


def resumed_from(experiment: Path) -> str | None:
    """The checkpoint the last attempt resumed from, as the manifest records it."""
    return manifest(experiment)["attempts"][-1].get("resumed_from")


def final(output: str) -> list[str]:
    found = re.search(r"FINAL (\{.*\})", output)
    assert found, output
    return json.loads(found.group(1))["shards"]


@pytest.fixture(scope="session")  # computed once a worker, whatever the order of tests
def reference(tmp_path_factory):
    """The shards' digests of an uninterrupted run on N ranks, storage_path only."""
    known: dict[int, list[str]] = {}

    def of(ranks: int) -> list[str]:
        def compute() -> list[str]:
            storage = tmp_path_factory.mktemp(f"reference{ranks}")
            return final(mpiexec(ranks, "--storage", str(storage), "--epochs", str(EPOCHS),
                                 "--shard-floats", "2048", script=SHARDED, env=QUICK).output)

        if ranks not in known:
            known[ranks] = computed_once(tmp_path_factory, f"multilevel{ranks}", compute)
        return known[ranks]

    return of


def on_nodes(cluster: Cluster, hosts: list[str], storage: Path, fault: str | None = None) -> str:
    """Two ranks on each of ``hosts``, the cache on each node's own disk."""
    env = {**QUICK, **({"HPCKIT_FAULT": fault} if fault else {})}
    outcome = cluster.mpiexec(hosts, 2, SHARDED, *cached_args(storage, cluster.local), env=env,
                              expect=None if fault else 0)
    if fault:
        assert outcome.returncode != 0, f"fault {fault} never fired:\n{outcome.output}"
    return outcome.output


def steps(experiment: Path) -> list[int]:
    return [line["step"] for line in metrics_lines(experiment)]


def levels(experiment: Path) -> dict[str, str]:
    return {c["directory"]: c["level"] for c in manifest(experiment)["checkpoints"]}


def test_a_node_that_lost_its_disk_restarts_from_its_partner_copy(nodes, tmp_path, reference):
    experiment = tmp_path / "exp"
    first = on_nodes(nodes, TWO, tmp_path, fault="committed:0:5:all")  # after checkpoint_000004
    assert "copying checkpoint_000000 to partner nodes in the background" in first, first
    assert re.search(r"committed checkpoint_000000 \(.*node-local caches\), \d+ ms after", first)
    assert "persisting checkpoint_000002 in the background" in first, "the drain is asynchronous"
    assert manifest(experiment)["latest"] == "checkpoint_000004"
    assert levels(experiment)["checkpoint_000004"] == CACHE
    assert not (experiment / "checkpoint_000004").exists(), "a cached checkpoint went to storage"
    partner = list(nodes.disk("nodeb").glob("*/partner/checkpoint_000004/state-rank0.npy"))
    assert partner, "nodeb holds no partner copy of nodea's files of checkpoint_000004"
    nodes.lose_disk("nodea")

    output = on_nodes(nodes, TWO, tmp_path)
    restart = re.search(r"restarting from checkpoint_000004 in the node-local caches \(.*from "
                        r"partner copies: (\d+).*sent between nodes: (\d+)\); nothing read from "
                        r"storage_path", output)
    assert restart and int(restart.group(1)) > 0 and int(restart.group(2)) > 0, output
    assert resumed_from(experiment) == "checkpoint_000004"
    assert steps(experiment) == list(range(EPOCHS)), "a step was repeated or skipped"
    assert final(output) == reference(4)
    assert levels(experiment)["checkpoint_000006"] == STORAGE, "the last one stayed cached"
    own = list(nodes.disk("nodea").glob("*/own/checkpoint_000004/state-rank0.npy"))
    assert own, "nodea did not get its own files back from its partner"


def test_three_nodes_killed_during_the_partner_copy_resume_from_the_last_commit(
        nodes, tmp_path, reference):
    """Rank 3 dies while receiving checkpoint_000003's partner copy: it is never committed."""
    three = ["nodea", "nodeb", "nodec"]
    experiment = tmp_path / "exp"
    on_nodes(nodes, three, tmp_path, fault="partnering:3:5:all")
    assert manifest(experiment)["latest"] == "checkpoint_000002"
    output = on_nodes(nodes, three, tmp_path)
    assert "resuming experiment" in output and "from checkpoint_000002" in output, output
    assert "restarting from" not in output, "no cached checkpoint is newer than the stored one"
    assert resumed_from(experiment) == "checkpoint_000002"
    assert steps(experiment) == list(range(EPOCHS))
    assert final(output) == reference(6)


def test_killed_while_draining_the_last_checkpoint_it_drains_on_the_rerun(nodes, tmp_path,
                                                                          reference):
    experiment = tmp_path / "exp"
    first = on_nodes(nodes, TWO, tmp_path, fault="draining:0:1:all")
    assert "FINAL" in first and "persisted checkpoint_000006" not in first, first
    assert levels(experiment)["checkpoint_000006"] == CACHE, "recorded on storage before its copy"
    output = on_nodes(nodes, TWO, tmp_path)
    assert "restarting from checkpoint_000006 in the node-local caches" in output, output
    assert resumed_from(experiment) == "checkpoint_000006"
    assert "persisted checkpoint_000006 to storage_path" in output
    assert levels(experiment)["checkpoint_000006"] == STORAGE
    verify = run([HPCKIT, "verify", str(experiment), "checkpoint_000006"], timeout=60)
    assert "ok: 9 file(s) in 1 checkpoint(s)" in verify.output, verify.output
    assert steps(experiment) == list(range(EPOCHS))
    assert final(output) == reference(4)


def test_a_stop_at_a_report_without_a_checkpoint_sends_the_cached_latest_to_storage(
        nodes, tmp_path, reference):
    """A checkpoint every second epoch; SIGUSR2 before epoch 2's metrics-only report, which
    commits the cached checkpoint of epoch 1 and stops: that one must reach storage_path, so
    that a job requeued on other nodes (or after the caches are wiped) resumes from it."""
    args = [*cached_args(tmp_path, nodes.local), "--every", "2", "--stop-at", "2"]
    stopped = nodes.mpiexec(TWO, 2, SHARDED, *args, env=QUICK, expect=None)
    assert stopped.returncode == 75, stopped.output
    experiment = tmp_path / "exp"
    assert levels(experiment) == {"checkpoint_000000": STORAGE}, stopped.output
    assert "persisted checkpoint_000000 to storage_path (the stop (SIGUSR2))" in stopped.output
    for host in TWO:
        nodes.lose_disk(host)
    output = nodes.mpiexec(TWO, 2, SHARDED, *args[:-2], env=QUICK).output
    assert "from checkpoint_000000" in output, output
    assert resumed_from(experiment) == "checkpoint_000000"
    assert steps(experiment) == list(range(EPOCHS)), output
    assert final(output) == reference(4)


def test_without_mpi_thread_multiple_partner_copies_run_inside_report(nodes, tmp_path,
                                                                      reference):
    env = {**QUICK, "MPI4PY_RC_THREAD_LEVEL": "serialized"}
    outcome = nodes.mpiexec(TWO, 2, SHARDED, *cached_args(tmp_path, nodes.local), env=env)
    assert outcome.output.count("partner copies run inside report()") == 1, outcome.output
    experiment = tmp_path / "exp"
    assert levels(experiment)["checkpoint_000004"] == CACHE
    partner = list(nodes.disk("nodeb").glob("*/partner/checkpoint_000004/state-rank0.npy"))
    assert partner, "nodeb holds no copy of nodea's files"
    assert steps(experiment) == list(range(EPOCHS))
    assert final(outcome.output) == reference(4)


def test_a_node_whose_cache_cannot_be_written_fails_the_run_and_the_rerun_resumes(
        nodes, tmp_path, reference):
    """The failed write surfaces from the background at the next report, on every rank,
    naming the node; nothing of it is committed, and a rerun with the cache repaired runs
    every step once."""
    experiment = tmp_path / "exp"
    root = Path(NodeCache(str(nodes.local), local(str(experiment))).root)
    nodes.mount_disk("nodeb")
    blocked = nodes.disk("nodeb") / root.relative_to(nodes.local) / "own"
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where nodeb's cache needs a directory")
    failed = nodes.mpiexec(TWO, 2, SHARDED, *cached_args(tmp_path, nodes.local), env=QUICK,
                           expect=None)
    assert failed.returncode != 0, failed.output
    assert re.search(r"rank [23] on nodeb: caching checkpoint_000000", failed.output), failed.output
    assert manifest(experiment)["checkpoints"] == [], failed.output
    assert not (experiment / "metrics.jsonl").exists(), "the failed report was logged"
    blocked.unlink()
    output = on_nodes(nodes, TWO, tmp_path)
    assert steps(experiment) == list(range(EPOCHS)), output
    assert final(output) == reference(4)


def test_a_job_restarted_on_other_nodes_falls_back_to_storage_path(nodes, tmp_path, reference):
    experiment = tmp_path / "exp"
    on_nodes(nodes, TWO, tmp_path, fault="committed:0:5:all")
    # The lock names a process on nodea, which nodec cannot probe: as the lock error says, a
    # user whose old job is gone removes it (or waits HPCKIT_LOCK_STALE_SECONDS).
    (experiment / ".hpckit-lock.json").unlink()
    output = on_nodes(nodes, ["nodec", "noded"], tmp_path)
    assert re.search(r"checkpoint_000004 is in the node-local caches of nodea, nodeb; this job "
                     r"runs on nodec, noded and cannot restart from it", output), output
    assert "from checkpoint_000002" in output
    assert resumed_from(experiment) == "checkpoint_000002"
    assert steps(experiment) == list(range(EPOCHS))
    assert final(output) == reference(4)


def test_on_one_node_the_cache_keeps_what_the_manifest_keeps(tmp_path, reference):
    """No partner on one node (said once); evicted checkpoints leave the cache too; the
    run's last checkpoint ends on storage_path, and Result and verify see only stored ones."""
    cache = tmp_path / "cache"
    output = mpiexec(3, *cached_args(tmp_path, cache), script=SHARDED, env=QUICK).output
    assert output.count("needs two nodes or more") == 1, output
    experiment = tmp_path / "exp"
    assert levels(experiment) == {"checkpoint_000004": CACHE, "checkpoint_000005": STORAGE,
                                  "checkpoint_000006": STORAGE}
    cached = sorted(p.name for p in cache.glob("*/own/*"))
    assert cached == ["checkpoint_000004", "checkpoint_000006"], cached
    assert sorted(p.name for p in experiment.glob("checkpoint_*")) == \
        ["checkpoint_000005", "checkpoint_000006"]
    verify = run([HPCKIT, "verify", str(experiment)], timeout=60).output
    assert "skipped checkpoint_000004: in the node-local caches of vm only" in verify.replace(
        os.uname().nodename, "vm"), verify
    assert final(output) == reference(3)


def test_the_levels_are_configured_or_refused_with_the_fix():
    CheckpointConfig(cache_dir="/dev/shm/x", persist_every=4, redundancy="partner")
    for bad, words in ((dict(cache_dir="relative"), "absolute path"),
                       (dict(persist_every=3), "needs a node-local cache_dir"),
                       (dict(cache_dir="/x", redundancy="xor"), "use redundancy='partner'"),
                       (dict(cache_dir="/x", persist_every=0), "integer >= 1")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            CheckpointConfig(**bad)


def test_rank_0_sends_every_nth_the_stopping_and_the_in_place_checkpoint_to_storage(tmp_path):
    levels = Levels(MPI.COMM_SELF, CheckpointConfig(cache_dir=str(tmp_path), persist_every=3),
                    local(str(tmp_path / "exp")), Nodes(("h",)))

    def plan(index: int, **changes) -> Plan:
        return Plan(index, directory=checkpoint_dirname(index), index=index, asynchronous=True,
                    **changes)

    assert [levels.leveled(plan(i), ()).level for i in range(6)] == \
        [CACHE, CACHE, STORAGE, CACHE, CACHE, STORAGE]
    assert not levels.leveled(plan(0), ()).asynchronous, "a cached checkpoint is written at once"
    partnered = Levels(MPI.COMM_SELF, CheckpointConfig(cache_dir=str(tmp_path), persist_every=3,
                                                       redundancy="partner"),
                       local(str(tmp_path / "exp")), Nodes(("h", "g")))
    assert partnered.leveled(plan(0), ()).asynchronous, "its partner copy runs in the background"
    drained = levels.leveled(replace(plan(2), asynchronous=False), ())
    assert drained.asynchronous, "a stored one drains to storage_path in the background"
    assert not levels.leveled(plan(2, stop="SIGUSR2"), ()).asynchronous, "but not at a stop"
    for stored in (plan(0, stop="SIGUSR2"), plan(0, placement=Placement.IN_PLACE),
                   Plan(0, directory="epoch_0", index=0)):
        assert levels.leveled(stored, ()).level == STORAGE, stored
    assert levels.leveled(plan(1), ("checkpoint_000000",)).kept == \
        ("checkpoint_000000", "checkpoint_000001")


def test_partners_form_a_ring_of_nodes_rank_by_rank():
    nodes = Nodes(("a", "a", "b", "b", "b", "c"))
    assert nodes.names == ["a", "b", "c"]
    assert [nodes.sends_to(rank) for rank in range(6)] == [2, 3, 5, 5, 5, 0]
    assert nodes.receives_from(5) == [2, 3, 4] and nodes.receives_from(1) == []
    assert Nodes(("a", "a")).receives_from(0) == [], "one node has no partner"


def test_a_manifest_with_cached_checkpoints_round_trips_and_says_its_version():
    record = CheckpointRecord(0, "checkpoint_000000", 0, 1.0, {},
                              (FileRecord("a", 1, 0, checksum_of(b"a")),), CACHE, ("n1",))
    cached = Manifest("e", 1, {}, {}, {}, 1.0).with_checkpoint(record)
    body = json.loads(encoding.to_json(cached))
    assert body["format_version"] == 3 and body["checkpoints"][0]["level"] == CACHE
    assert encoding.from_json(encoding.to_json(cached), "here") == cached
    stored = cached.reached_storage("checkpoint_000000")
    assert stored.checkpoints[0].on_storage and stored.checkpoints[0].hosts == ()
    assert encoding.from_json(encoding.to_json(stored), "here") == stored


def test_files_sent_to_a_rank_arrive_whole_in_chunks_and_errors_come_back(tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "CHUNK", 1000)
    sources = {"big": os.urandom(3500), "exact": os.urandom(2000), "empty": b""}
    for name, data in sources.items():
        (tmp_path / name).write_bytes(data)
    names = [*sources, "missing"]
    sends = [Send(0, str(tmp_path / name), name) for name in names]
    receives = [Receive(0, name, str(tmp_path / "out" / name)) for name in names]
    got = {r.name: r for r in exchange(MPI.COMM_SELF, sends, receives)}
    for name, data in sources.items():
        assert (tmp_path / "out" / name).read_bytes() == data and got[name].error is None
        assert got[name].size == len(data)
    assert "could not read" in str(got["missing"].error)


def test_an_optional_file_its_sender_lacks_arrives_as_absent_and_the_others_whole(tmp_path):
    """A rank's resume state goes with its partner copy where it has one: the receiver
    expects it either way, so a sender without one says so rather than leave it waiting."""
    (tmp_path / "kept").write_bytes(b"state")
    sends = [Send(0, str(tmp_path / name), name, optional=True) for name in ("none", "kept")]
    receives = [Receive(0, name, str(tmp_path / "out" / name)) for name in ("none", "kept")]
    got = {r.name: r for r in exchange(MPI.COMM_SELF, sends, receives)}
    assert got["none"].absent and got["none"].error is None
    assert not (tmp_path / "out" / "none").exists()
    assert not got["kept"].absent and (tmp_path / "out" / "kept").read_bytes() == b"state"


def test_a_background_copy_waiting_for_a_peer_ends_when_its_attempt_is_abandoned(tmp_path):
    """A partner copy whose peer never sends (gone with its attempt) must not keep the
    background thread, and so the attempt's end, waiting for ever."""
    abandon = threading.Event()
    never = [Receive(0, "state.npy", str(tmp_path / "state.npy"))]
    copy = threading.Thread(target=lambda: failed.append(_raised(
        lambda: exchange(MPI.COMM_SELF.Dup(), [], never, abandon=abandon))))
    failed: list[BaseException | None] = []
    copy.start()
    copy.join(0.3)
    assert copy.is_alive(), "it waits while the attempt goes on"
    abandon.set()
    copy.join(10)
    assert not copy.is_alive() and isinstance(failed[0], CheckpointError), failed
    assert "abandoned" in str(failed[0])


def _raised(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001  (the test inspects it)
        return exc
    return None


class _Given(UserCallback):
    def __init__(self) -> None:
        self.paths: list[tuple[str, bool]] = []

    def after_report(self, run_context, metrics, checkpoint) -> None:
        if checkpoint is not None:
            self.paths.append((checkpoint.path, os.path.isfile(os.path.join(checkpoint.path,
                                                                            "m.txt"))))


def _three_checkpoints(config: dict) -> None:
    for step in range(3):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "m.txt").write_text(str(step))
            hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d))


def test_user_callbacks_are_given_each_checkpoint_where_it_is(tmp_path):
    given = _Given()
    DataParallelTrainer(_three_checkpoints, run_config=RunConfig(
        name="cb", storage_path=str(tmp_path / "shared"), callbacks=[given],
        checkpoint_config=CheckpointConfig(cache_dir=str(tmp_path / "cache"),
                                           persist_every=2))).fit()
    assert [os.path.basename(p) for p, _ in given.paths] == \
        ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    assert all(found for _, found in given.paths), given.paths
    assert given.paths[0][0].startswith(str(tmp_path / "cache")), "cached: the cache's copy"
    assert given.paths[1][0].startswith(str(tmp_path / "shared")), "stored: storage_path"


def _until(done, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if done():
            return
        threading.Event().wait(0.05)


def _evictions_at_each_commit(config: dict) -> None:
    """checkpoint_000001 goes to storage_path (persist_every=2); the cached commit of
    checkpoint_000002 evicts it (num_to_keep=1), and its directory must go then, not at the
    next commit on storage_path."""
    experiment = Path(config["experiment"])
    stored = experiment / "checkpoint_000001"
    for step in range(3):
        if step == 2:  # checkpoint_000001 goes to storage_path in the background
            _until(lambda: (stored / "m.txt").is_file())
            assert (stored / "m.txt").is_file()
        with tempfile.TemporaryDirectory() as d:
            Path(d, "m.txt").write_text(str(step))
            hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
    _until(lambda: not stored.exists())  # the purge runs in the background
    kept = [r["directory"] for r in json.loads((experiment / "manifest.json").read_text())
            ["checkpoints"]]
    assert kept == ["checkpoint_000002"], kept
    assert not stored.exists(), "the cached commit of checkpoint_000002 evicted " \
        "checkpoint_000001 but its directory on storage_path is still there"


def test_a_cached_commit_deletes_what_it_evicts_at_once(tmp_path):
    DataParallelTrainer(
        _evictions_at_each_commit, train_loop_config={"experiment": str(tmp_path / "s" / "ev")},
        run_config=RunConfig(name="ev", storage_path=str(tmp_path / "s"),
                             checkpoint_config=CheckpointConfig(
                                 num_to_keep=1, cache_dir=str(tmp_path / "cache"),
                                 persist_every=2))).fit()
