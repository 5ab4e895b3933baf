"""report(checkpoint_upload_fn=...) as in Ray 2.60: the user's upload replaces hpckit's copy;
with ASYNC it runs on hpckit's background thread; checkpoint_dir_name names the directory it
uploads into; on S3 it uploads straight to the bucket; a checkpoint returned anywhere but the
checkpoint's own directory in the experiment is one clear error. DCP's async_save through it
is in test_async.py, kills while it runs in test_kill.py."""

from __future__ import annotations

import os
import sys
import tempfile
import threading

import pytest
from conftest import HERE, mpiexec, run

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig
from hpckit.errors import CheckpointError, HpckitError
from hpckit.experiment.reading import read_manifest
from hpckit.run.writing.plan import REPORT, Announcement, Placement
from hpckit.run.commit.planning import make_plan
from hpckit.storage.location import resolve

SHARDED = HERE / "ranks" / "sharded.py"


def fit(train, storage: str, **config):
    return DataParallelTrainer(train, train_loop_config=config,
                               run_config=RunConfig(name="exp", storage_path=storage)).fit()


def local_upload(payload: bytes, events: list | None = None, release=None):
    """An upload function writing one file into the directory it is given."""
    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        if events is not None:
            events.append(("upload", threading.get_ident(), checkpoint_dir_name))
        released = release.wait(timeout=20) if release is not None else True
        directory = os.path.join(hpckit.get_context().get_experiment_path(), checkpoint_dir_name)
        with open(os.path.join(directory, "w.bin"), "wb") as f:
            f.write(payload)
        if events is not None:
            events.append(("uploaded", released))
        return Checkpoint.from_directory(directory)
    return upload


def uploads_in_the_background(config: dict) -> None:
    events, release = config["events"], threading.Event()
    events.append(("training", threading.get_ident()))
    pending = os.path.join(hpckit.get_context().get_experiment_path(), "checkpoint_000000")
    with tempfile.TemporaryDirectory() as d:
        hpckit.report({"step": 0}, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_upload_mode="async",
                      checkpoint_upload_fn=local_upload(b"x" * 1000, events, release))
    events.append(("returned", os.path.exists(os.path.join(pending, "w.bin"))))
    release.set()


def test_an_async_upload_fn_runs_on_the_background_thread_and_is_committed(tmp_path):
    events: list = []
    result = fit(uploads_in_the_background, str(tmp_path), events=events)
    training = events[0][1]
    upload = next(e for e in events if e[0] == "upload")
    assert upload[1] != training and upload[2] == "checkpoint_000000", events
    # report() returned before the upload wrote its file, and the upload then went on.
    assert ("returned", False) in events and events[-1] == ("uploaded", True), events
    record = read_manifest(resolve(str(tmp_path / "exp"))).checkpoints[-1]
    assert record.directory == "checkpoint_000000"
    assert [(f.path, f.size) for f in record.files] == [("w.bin", 1000)]
    assert record.files[0].checksum
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000000")


def uploads_named(config: dict) -> None:
    names: list = config["names"]

    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        names.append(checkpoint_dir_name)
        return local_upload(b"y" * 10)(checkpoint, checkpoint_dir_name)

    for step in range(2):
        local = tempfile.mkdtemp(prefix="local-")  # what Ray would have uploaded
        config["local"].append(local)
        hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(local),
                      checkpoint_dir_name=f"epoch-{step}",
                      checkpoint_upload_mode=config["mode"], checkpoint_upload_fn=upload)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_checkpoint_dir_name_names_the_directory_the_upload_fn_gets(mode, tmp_path):
    names: list = []
    local: list = []
    result = fit(uploads_named, str(tmp_path), names=names, mode=mode, local=local)
    assert names == ["epoch-0", "epoch-1"]
    records = read_manifest(resolve(str(tmp_path / "exp"))).checkpoints
    assert [r.directory for r in records] == ["epoch-0", "epoch-1"]
    assert all([f.path for f in r.files] == ["w.bin"] for r in records), records
    assert sorted(os.listdir(tmp_path / "exp" / "epoch-1")) == ["w.bin"]  # no pending marker
    # delete_local_checkpoint_after_upload defaults to True for ASYNC alone, as in Ray.
    assert [os.path.isdir(d) for d in local] == [mode == "sync"] * 2
    assert result.checkpoint is not None and result.checkpoint.path.endswith("epoch-1")


def uploads_elsewhere(config: dict) -> None:
    beside = os.path.dirname(hpckit.get_context().get_experiment_path())  # the test's tmp_path

    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        return Checkpoint.from_directory(tempfile.mkdtemp(prefix="elsewhere-", dir=beside))

    for step in range(2):
        hpckit.report({"step": step}, checkpoint=Checkpoint(tempfile.mkdtemp(dir=beside)),
                      checkpoint_upload_mode=config["mode"], checkpoint_upload_fn=upload)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_upload_fn_returning_another_directory_is_one_clear_error(mode, tmp_path):
    with pytest.raises(HpckitError) as raised:
        fit(uploads_elsewhere, str(tmp_path), mode=mode)
    message = str(raised.value)
    assert "checkpoint_upload_fn returned a checkpoint at " in message, message
    assert "outside this checkpoint's directory in the experiment; upload into " \
        f"{tmp_path / 'exp' / 'checkpoint_000000'}" in message, message
    assert not read_manifest(resolve(str(tmp_path / "exp"))).checkpoints


def upload_fails(config: dict) -> None:
    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        raise RuntimeError("the site's upload tool is down")

    for step in range(3):
        hpckit.report({"step": step}, checkpoint=Checkpoint(tempfile.mkdtemp()),
                      checkpoint_upload_mode="async", checkpoint_upload_fn=upload)
        config["returned"].append(step)


@pytest.mark.waiting  # counts the reports before a background failure lands
def test_a_failed_async_upload_fn_is_raised_at_a_later_report(tmp_path):
    returned: list = []
    with pytest.raises(HpckitError, match="the site's upload tool is down") as raised:
        fit(upload_fails, str(tmp_path), returned=returned)
    assert "checkpoint_upload_fn(" in str(raised.value) and "checkpoint_000000" in str(raised.value)
    assert returned and returned[0] == 0 and len(returned) < 3, returned
    assert not read_manifest(resolve(str(tmp_path / "exp"))).checkpoints


def uploads_to_s3(config: dict) -> None:
    ctx = hpckit.get_context()
    storage = ctx.get_storage_filesystem()

    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        root = ctx.get_experiment_path() if config["where"] == "inside" else \
            f"{ctx.get_storage_path()}/elsewhere"
        directory = f"{root}/{checkpoint_dir_name}"
        for name, data in {"model.bin": b"m" * 3000, "sub/opt.bin": b"o" * 500}.items():
            with storage.open_output_stream(f"{directory}/{name}") as out:
                out.write(data)
        return Checkpoint(directory, storage)

    for step in range(2):
        hpckit.report({"step": step}, checkpoint=Checkpoint(ctx.get_experiment_path(), storage),
                      checkpoint_dir_name=f"step-{step}", checkpoint_upload_mode="async",
                      checkpoint_upload_fn=upload)


def test_an_upload_fn_uploads_straight_to_s3(s3, tmp_path):
    storage = s3.uri(f"upload-{tmp_path.name}")
    result = fit(uploads_to_s3, storage, where="inside")
    experiment = resolve(storage).join("exp")
    records = read_manifest(experiment).checkpoints
    assert [r.directory for r in records] == ["step-0", "step-1"]
    assert [(f.path, f.size) for f in records[-1].files] == [("model.bin", 3000),
                                                             ("sub/opt.bin", 500)]
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "sub", "opt.bin"), "rb").read() == b"o" * 500


def test_an_upload_fn_returning_another_s3_prefix_is_refused(s3, tmp_path):
    storage = s3.uri(f"upload-out-{tmp_path.name}")
    with pytest.raises(HpckitError, match="outside this checkpoint's directory in the "
                                          "experiment; upload into s3://"):
        fit(uploads_to_s3, storage, where="elsewhere")
    assert not read_manifest(resolve(storage).join("exp")).checkpoints


def test_ranks_upload_their_shares_to_s3_and_no_writer_is_recorded_for_them(s3, tmp_path):
    """Every rank's checkpoint_upload_fn uploads into the checkpoint, so any of them may have
    written any object there: the manifest records no writer (each rank hashes a share, as
    test_async's split by size shows)."""
    storage = s3.uri(f"upload-ranks-{tmp_path.name}")
    run = mpiexec(3, "--storage", storage, "--epochs", "3", "--mode", "upload-async",
                  script=SHARDED, env={"HPCKIT_TENSORBOARD": "0"}, timeout=120)
    assert run.line("FINAL") is not None
    records = read_manifest(resolve(storage).join("exp")).checkpoints
    assert [r.directory for r in records] == ["checkpoint_000001", "checkpoint_000002"]
    files = records[-1].files
    assert len(files) == 7 and {f.rank for f in files} == {None}, files


def announce(uploading: bool, in_place: bool = True, files=None, dir_name=None) -> Announcement:
    return Announcement(REPORT, 1, files, in_place=in_place and files is None,
                        asynchronous=True, dir_name=dir_name, uploading=uploading)


def test_a_plan_takes_a_name_for_an_upload_and_refuses_uploads_mixed_with_other_hand_ins():
    plan = make_plan([announce(True, dir_name="best"), announce(True, dir_name="best")], 0, 4)
    assert plan.placement is Placement.UPLOADED and plan.directory == "best"
    assert make_plan([announce(True), announce(False, in_place=False)], 0, 4).placement is Placement.UPLOADED
    with pytest.raises(CheckpointError, match=r"rank\(s\) 0 passed checkpoint_upload_fn and "
                                              r"rank\(s\) 1 handed a checkpoint without one"):
        make_plan([announce(True), announce(False)], 0, 4)
    with pytest.raises(CheckpointError, match="rank\\(s\\) 1 handed"):
        make_plan([announce(True), announce(False, files=[("a", 1)])], 0, 4)


HANDS_ITS_CWD = """
import sys
import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig

def train(config):
    for step in range(2):  # "." is this process's working directory: the user's project
        hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory("."),
                      checkpoint_upload_mode="async")

DataParallelTrainer(train, run_config=RunConfig(name="e", storage_path=sys.argv[1])).fit()
"""


def test_a_directory_that_holds_the_working_directory_is_never_deleted(tmp_path):
    """An ASYNC report deletes the directory it was handed once persisted (Ray's
    delete_local_checkpoint_after_upload), but not ``Checkpoint.from_directory(".")``: that
    would take the user's working tree with it. Run in a directory of its own, never here."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(HANDS_ITS_CWD)
    (project / "notes.txt").write_text("keep me")
    done = run([sys.executable, "train.py", str(tmp_path / "storage")], timeout=120,
               cwd=project)
    assert (project / "notes.txt").read_text() == "keep me", done.output
    assert (project / "train.py").exists()
    assert "which holds the current directory; it is not deleted" in done.output, done.output
    kept = tmp_path / "storage" / "e" / "checkpoint_000001" / "notes.txt"
    assert kept.read_text() == "keep me", done.output  # persisted all the same


def uploads_a_name_that_is_not_utf8(config: dict) -> None:
    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        directory = os.path.join(hpckit.get_context().get_experiment_path(), checkpoint_dir_name)
        with open(os.path.join(os.fsencode(directory), b"bad\xffname"), "wb") as f:
            f.write(b"w")
        return Checkpoint.from_directory(directory)

    with tempfile.TemporaryDirectory() as d:
        hpckit.report({"step": 0}, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_upload_fn=upload)


def test_an_uploaded_name_that_is_not_utf8_is_refused_naming_it(tmp_path):
    """#51: the refusal was a CommitError that named no file."""
    with pytest.raises(HpckitError, match=r"bad\\udcffname' is not UTF-8"):
        fit(uploads_a_name_that_is_not_utf8, str(tmp_path))
    assert read_manifest(resolve(str(tmp_path / "exp"))).checkpoints == ()
