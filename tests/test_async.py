"""Asynchronous checkpoints, checkpoints written in place, and torch DCP through report(), on
real ranks, locally and on the S3 server. Kills in their phases are in test_kill.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from support import reliability
from conftest import HERE, mpiexec
from support.once import computed_once

from hpckit import CheckpointConfig, CheckpointUploadMode, ConfigError
from hpckit.errors import CommitError
from hpckit.experiment.manifest import FileRecord
from hpckit.run.mpi.comm import RankFailure
from hpckit.run.commit.planning import attributed, merge, unrecorded
from hpckit.run.writing.plan import Announcement, Persisted, Placement, Plan, Finished
from hpckit.run.commit.planning import raise_background_failure, finished_everywhere
from hpckit.run.writing.writer import state_name
from hpckit.run.writing.shares import share_hashing
from hpckit.storage import files
from hpckit.storage.location import resolve

SHARDED = HERE / "ranks" / "sharded.py"
HANDOVER = HERE / "ranks" / "handover.py"
DCP = HERE / "ranks" / "dcp.py"
QUICK = {"HPCKIT_TENSORBOARD": "0"}
EPOCHS = 9


def sharded(ranks: int, storage: str, mode: str, **env: str):
    return mpiexec(ranks, "--storage", storage, "--epochs", str(EPOCHS), "--every", "2",
                   "--mode", mode, script=SHARDED, env={**QUICK, **env}, timeout=120)


def outcome(run, experiment: str) -> tuple[str, list[tuple[int, str | None]]]:
    """FINAL's digests, and metrics.jsonl's (step, checkpoint) in file order."""
    location = resolve(experiment)
    lines = files.read_bytes(location.join("metrics.jsonl")).decode().splitlines()
    state = reliability.check_experiment(experiment, None)
    assert not state.leftovers and not state.temp_files, state
    assert ".staging" not in [i.base_name for i in files.list_dir(location)]
    return run.line("FINAL"), [(m["step"], m["checkpoint"]) for m in map(json.loads, lines)]


@pytest.fixture(scope="session")
def synchronous(tmp_path_factory):
    """The synchronous run's outcome, computed once a test run, whichever worker asks first."""
    def compute():
        storage = tmp_path_factory.mktemp("sync")
        return outcome(sharded(3, str(storage), "sync"), str(storage / "exp"))

    final, lines = computed_once(tmp_path_factory, "async-synchronous", compute)
    return final, [tuple(line) for line in lines]


@pytest.mark.parametrize("mode", ["async", "in-place", "in-place-async"])
def test_every_mode_commits_what_sync_commits_in_report_order(mode, tmp_path, synchronous):
    final, lines = outcome(sharded(3, str(tmp_path), mode), str(tmp_path / "exp"))
    assert final == synchronous[0]
    assert lines == synchronous[1] == [
        (s, f"checkpoint_{s // 2:06d}" if s % 2 else None) for s in range(EPOCHS)]


@pytest.mark.parametrize("mode", ["async", "in-place-async"])
def test_asynchronous_checkpoints_on_s3(mode, s3, tmp_path, synchronous):
    storage = s3.uri(f"async-{mode}-{tmp_path.name}")
    assert outcome(sharded(3, storage, mode), storage.replace("?", "/exp?", 1)) == synchronous


def scenario(name: str, tmp_path, expect: int | None = 0, **env: str):
    handed = tmp_path / "handed"
    handed.mkdir(exist_ok=True)
    run = mpiexec(3, name, "--storage", str(tmp_path), "--handed", str(handed), script=HANDOVER,
                  env={**QUICK, **env}, expect=expect, timeout=90)
    found = re.findall(r'SEEN (\S+) (true|false|"(?:[^"\\]|\\.)*")', run.output)
    return run, {name: json.loads(value) for name, value in found}


def test_async_takes_or_copies_the_handed_directory_and_commits_in_order(tmp_path):
    _, seen = scenario("modes", tmp_path)
    assert seen == {"moved_away": True, "latest_while_in_flight": True,
                    "kept_and_rewritten": True, "first_committed": True,
                    "first_not_copied": True}
    second = tmp_path / "modes" / "checkpoint_000001"
    assert all((second / f"part-{r}.bin").read_bytes() == b"second" * 1000 for r in range(3))
    assert reliability.check_experiment(tmp_path / "modes", None).latest == "checkpoint_000001"


def test_checkpoint_dir_name_names_the_directory_and_a_killed_one_is_removed(tmp_path):
    killed, _ = scenario("named", tmp_path, expect=None, HPCKIT_FAULT="gathered:0:2",
                         NAME_PREFIX="a0")
    assert killed.returncode != 0
    experiment = tmp_path / "named"
    assert (experiment / "a0-epoch_1" / ".hpckit-pending").exists()
    run, seen = scenario("named", tmp_path, NAME_PREFIX="a1")
    assert "removed leftovers" in run.output and "a0-epoch_1" in run.output
    assert seen == {"latest": "a1-epoch_2", "taken": True}
    state = reliability.check_experiment(experiment, None)
    assert state.committed == ["a0-epoch_0", "a1-epoch_0", "a1-epoch_1", "a1-epoch_2"]
    assert not (experiment / "a0-epoch_1").exists()
    assert not list(experiment.glob("*/.hpckit-pending"))


def test_a_report_made_synchronous_waits_for_saves_still_being_written(tmp_path):
    run, seen = scenario("mixed", tmp_path)
    assert seen == {"committed_at_once": True}
    said = "checkpoint_000000 is written synchronously: rank(s) 0 asked for ASYNC, rank(s) 1, 2"
    assert run.output.count(said) == 1, run.output
    record = json.loads((tmp_path / "mixed" / "manifest.json").read_text())["checkpoints"][0]
    assert sorted(f["path"] for f in record["files"]) == [f"late-{r}.bin" for r in range(3)]
    assert reliability.check_experiment(tmp_path / "mixed", None).latest == "checkpoint_000000"


def test_one_rank_handing_async_while_the_others_report_metrics_only_stays_async(tmp_path):
    run, seen = scenario("solo", tmp_path)
    assert seen == {"in_flight": True}, run.output
    assert "written synchronously" not in run.output
    state = reliability.check_experiment(tmp_path / "solo", None)
    assert state.committed == ["checkpoint_000000"]
    assert (tmp_path / "solo" / "checkpoint_000000" / "part-0.bin").read_bytes() == b"solo" * 1000


def test_a_committed_checkpoint_handed_again_stays_whole(tmp_path):
    scenario("rehand", tmp_path)
    state = reliability.check_experiment(tmp_path / "rehand", None)
    assert state.committed == ["checkpoint_000000", "checkpoint_000001"]
    assert (tmp_path / "rehand" / "checkpoint_000000" / "part-0.bin").read_bytes() == b"kept" * 100


def test_files_written_in_place_are_committed_where_they_are(tmp_path):
    _, seen = scenario("in_place", tmp_path)
    assert seen["inside_experiment"] and seen["committed_in_place"] and seen["inside_refused"]
    assert seen["next_dir"] == "checkpoint_000001"
    assert "takes the files already in get_context().get_checkpoint_dir()" in \
        seen["no_upload_elsewhere"]


def test_the_manifest_records_who_wrote_each_file_written_in_place(tmp_path):
    """Every rank hashes a share of an in-place checkpoint, but the manifest names the rank
    that wrote each file: rank 0 where it alone handed the directory, and no rank (null)
    where every rank handed it, since hpckit cannot tell which of them wrote a file there."""
    scenario("writers", tmp_path)
    first, second = json.loads((tmp_path / "writers" / "manifest.json").read_text())["checkpoints"]
    assert {f["path"]: f["rank"] for f in first["files"]} == {
        "extra.json": 0, "model.pt": 0, "optim.pt": 0}
    assert {f["path"]: f["rank"] for f in second["files"]} == {
        "part-0.bin": None, "part-1.bin": None, "part-2.bin": None}


def test_a_failed_background_persist_fails_the_next_report_on_every_rank(tmp_path):
    run, _ = scenario("failing", tmp_path, expect=None)
    assert run.returncode != 0
    raised = re.findall(r"RAISED rank=(\d) (persisting \S+ in the background failed on rank \d)",
                        run.output)
    assert sorted(raised) == [(str(r), "persisting checkpoint_000000 in the background failed "
                               "on rank 2") for r in range(3)], run.output
    manifest = json.loads((tmp_path / "failing" / "manifest.json").read_text())
    assert manifest["checkpoints"] == [] and manifest["attempts"][-1]["status"] == "failed"


def test_the_in_flight_wait_is_logged_once(tmp_path):
    run, _ = scenario("slow", tmp_path)
    assert run.output.count("report() waits for the previous checkpoint") == 1
    assert reliability.check_experiment(tmp_path / "slow", None).committed == [
        f"checkpoint_{i:06d}" for i in range(4)]


@pytest.mark.parametrize("flavour", ["sync", "async", "upload-fn"])
def test_dcp_state_is_saved_in_place_and_resumed_resharded(flavour, tmp_path):
    # upload-fn: report(checkpoint_upload_fn=...) runs DCP's async_save into the experiment.
    extra = {"sync": [], "async": ["--async"], "upload-fn": ["--async", "--upload", "dcp"]}[flavour]
    first = mpiexec(2, "--storage", str(tmp_path), "--epochs", "3", *extra, script=DCP,
                    env=QUICK, timeout=180)
    assert json.loads(first.line("FINAL")) == {"sum": 6 * 12 * 4096, "epoch": 2}
    record = json.loads((tmp_path / "dcp" / "manifest.json").read_text())["checkpoints"][-1]
    assert {f["path"] for f in record["files"]} == {".metadata", "__0_0.distcp", "__1_0.distcp",
                                                    state_name(0)}  # the node's two ranks
    resumed = mpiexec(3, "--storage", str(tmp_path), "--epochs", "5", *extra, script=DCP,
                      env=QUICK, timeout=180)
    assert "RESUMED epoch=2 world=3" in resumed.output
    assert json.loads(resumed.line("FINAL")) == {"sum": 15 * 12 * 4096, "epoch": 4}


def test_a_checkpoint_upload_fn_that_uploads_elsewhere_is_one_clear_error(tmp_path):
    run = mpiexec(2, "--storage", str(tmp_path), "--epochs", "2", "--upload", "outside",
                  script=DCP, env=QUICK, timeout=120, expect=None)
    assert run.returncode != 0 and run.line("FINAL") is None, run.output
    assert "checkpoint_upload_fn returned a checkpoint at" in run.output, run.output
    assert "outside this checkpoint's directory in the experiment; upload into " \
        f"{tmp_path / 'dcp' / 'checkpoint_000000'}" in run.output, run.output
    assert not json.loads((tmp_path / "dcp" / "manifest.json").read_text())["checkpoints"]


def test_dcp_state_on_s3(s3, tmp_path):
    storage = s3.uri(f"dcp-{tmp_path.name}")
    run = mpiexec(2, "--storage", storage, "--epochs", "2", "--async", script=DCP, env=QUICK,
                  timeout=180)
    assert json.loads(run.line("FINAL"))["sum"] == 3 * 12 * 4096
    resumed = mpiexec(3, "--storage", storage, "--epochs", "3", script=DCP, env=QUICK,
                      timeout=180)
    assert json.loads(resumed.line("FINAL")) == {"sum": 6 * 12 * 4096, "epoch": 2}


def test_upload_modes_parse_as_ray_names_them():
    assert CheckpointUploadMode.parse("async") is CheckpointUploadMode.ASYNC
    assert CheckpointUploadMode.parse(CheckpointUploadMode.NO_UPLOAD).value == "NO_UPLOAD"
    assert CheckpointUploadMode.ASYNC.default_delete_local_checkpoint_after_upload()
    assert not CheckpointUploadMode.SYNC.default_delete_local_checkpoint_after_upload()
    with pytest.raises(ConfigError, match="use hpckit.CheckpointUploadMode.SYNC, ASYNC"):
        CheckpointUploadMode.parse("later")
    with pytest.raises(ConfigError, match="max_checkpoints_in_flight=0"):
        CheckpointConfig(max_checkpoints_in_flight=0)


def test_in_place_files_are_split_by_size_the_same_way_on_every_rank():
    listing = [("big", 100), ("a", 10), ("b", 10), ("c", 60), ("d", 40)]
    shares = [share_hashing(listing, 3, rank) for rank in range(3)]
    assert shares == [["big"], ["c"], ["d", "a", "b"]]
    assert sorted(sum(shares, [])) == sorted(name for name, _ in listing)
    assert share_hashing(list(reversed(listing)), 3, 1) == shares[1]


def test_background_checkpoints_commit_in_order_and_fail_together():
    done = Persisted([FileRecord("x", 1, 0, "h")])
    ahead = [Announcement("report", 1, finished=(Finished("c0", done), Finished("c1", done))),
             Announcement("report", 1, finished=(Finished("c0", done),))]
    ready, failures = finished_everywhere(ahead, ["c0", "c1"])
    assert [d for d, _, _ in ready] == ["c0"] and failures == []
    failure = RankFailure(1, "OSError: disk full", "", None)
    failed = [ahead[0], Announcement("report", 1, finished=(Finished("c0", done),
                                                            Finished("c1", None, failure)))]
    ready, failures = finished_everywhere(failed, ["c0", "c1"])
    assert [d for d, _, _ in ready] == ["c0"] and failures == [failure]
    with pytest.raises(CommitError, match="persisting c1 in the background failed on rank 1"):
        raise_background_failure("c1", failures)


def test_in_place_records_merge_by_name_and_late_names_are_found():
    plan = Plan(0, directory="checkpoint_000000", placement=Placement.IN_PLACE)
    per_rank = [Persisted([FileRecord("a", 1, 0, "h1")], ("a", "b", "late")),
                Persisted([FileRecord("b", 2, 1, "h2"), FileRecord("a", 1, 1, "h1")], ("a", "b"))]
    assert [(r.path, r.rank) for r in merge(plan, per_rank)] == [("a", 0), ("b", 1)]
    assert unrecorded(per_rank) == ["late"]
    per_rank[1].records.append(FileRecord("a", 1, 1, "other"))
    with pytest.raises(Exception, match="different contents"):
        merge(plan, per_rank)


def test_in_place_records_name_the_rank_whose_save_wrote_the_file():
    """A file a rank's own save wrote (save_state, announced as ``later``) is that rank's,
    whoever else handed the directory; the rest are the sole handing rank's, or no rank's."""
    records = [FileRecord("state-1.pt", 1, 1, "h"), FileRecord("model.pt", 1, 2, "h")]
    listed = [Persisted([], ("state-1.pt", "model.pt"))]
    several = Plan(0, directory="checkpoint_000000", placement=Placement.IN_PLACE, later={1: ("state-1.pt",)})
    assert [r.rank for r in attributed(several, listed, records)] == [1, None]
    alone = replace(several, placed_by=0)
    assert [r.rank for r in attributed(alone, listed, records)] == [1, 0]
    uploaded_own = [Persisted(records)]  # object storage: each rank uploads its own staging
    assert attributed(several, uploaded_own, records) == records


def trains_between_reports(config: dict) -> None:
    import os
    import time

    import hpckit

    for step in range(4):
        directory = hpckit.get_context().get_checkpoint_dir()
        with open(os.path.join(directory, "w.bin"), "wb") as f:
            f.write(bytes([step]) * 1000)
        time.sleep(0.6)  # training: the background checkpoint and its commit finish meanwhile
        started = time.perf_counter()
        hpckit.report({"step": step}, checkpoint=hpckit.Checkpoint.from_directory(directory),
                      checkpoint_upload_mode="async")
        config["blocked"].append(time.perf_counter() - started)


@pytest.mark.waiting  # it times report()
def test_rank_0_commits_a_background_checkpoint_while_the_ranks_train(tmp_path, monkeypatch):
    """A manifest write that takes 0.4 s (a loaded filesystem) is not waited for by report():
    the next collective step tells the ranks that the commit landed."""
    import time

    from hpckit import DataParallelTrainer, RunConfig
    from hpckit.experiment.experiment import Experiment

    write = Experiment._replace

    def slow(self, manifest):  # type: ignore[no-untyped-def]
        time.sleep(0.4)
        write(self, manifest)

    monkeypatch.setattr(Experiment, "_replace", slow)
    blocked: list[float] = []
    result = DataParallelTrainer(trains_between_reports, train_loop_config={"blocked": blocked},
                                 run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    assert max(blocked) < 0.2, f"report() waited for a manifest write: {blocked}"
    body = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert [c["directory"] for c in body["checkpoints"]] == [f"checkpoint_{i:06d}" for i in range(4)]
    lines = [json.loads(l) for l in (tmp_path / "e" / "metrics.jsonl").read_text().splitlines()]
    assert [(l["step"], l["checkpoint"]) for l in lines] == \
        [(i, f"checkpoint_{i:06d}") for i in range(4)]
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000003")
