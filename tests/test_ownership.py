"""What hpckit may move or delete of what it is handed (hpckit/experiment/ownership.py): only
the handed directory's own regular, singly-linked files, reached through no link, in no
experiment. Everything else is copied and left as it was (#51)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, MPIEXEC, run

import hpckit
from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, settings
from hpckit.errors import CheckpointError, HpckitError
from hpckit.experiment.reading import read_manifest
from hpckit.storage.location import resolve


def _hands_links(config: dict) -> None:
    """A handed directory with a model, a link to the dataset directory and one to a file."""
    dataset = config["dataset"]
    with tempfile.TemporaryDirectory() as d:
        Path(d, "model.bin").write_bytes(b"weights")
        os.symlink(dataset, os.path.join(d, "data"))
        os.symlink(os.path.join(dataset, "labels.csv"), os.path.join(d, "labels.csv"))
        hpckit.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_upload_mode="async")


def _dataset(root: Path) -> dict[str, bytes]:
    (root / "dataset" / "train").mkdir(parents=True)
    files = {"train/a.bin": b"a" * 100, "labels.csv": b"x,y\n"}
    for name, content in files.items():
        (root / "dataset" / name).write_bytes(content)
    return files


def _contents(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")
            if p.is_file()}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_links_in_an_async_handed_directory_are_read_through_and_their_targets_stay(
        tmp_path, where, request):
    files = _dataset(tmp_path)
    storage = (request.getfixturevalue("s3").uri(f"links-{tmp_path.name}") if where == "s3"
               else str(tmp_path / "runs"))
    result = DataParallelTrainer(_hands_links, train_loop_config={
        "dataset": str(tmp_path / "dataset")}, run_config=RunConfig(
            name="e", storage_path=storage)).fit()
    assert _contents(tmp_path / "dataset") == files, "the dataset changed"
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert _contents(Path(d)) == {"model.bin": b"weights", "data/train/a.bin": b"a" * 100,
                                      "data/labels.csv": b"x,y\n", "labels.csv": b"x,y\n"}
        assert not any(p.is_symlink() for p in Path(d).rglob("*")), "a link was committed"
    experiment = resolve(storage).join("e")
    records = read_manifest(experiment).checkpoints
    assert [r.directory for r in records] == ["checkpoint_000000"]
    if where == "local":
        verified = run([HPCKIT, "verify", str(tmp_path / "runs" / "e")], timeout=60)
        assert verified.returncode == 0


def _reports(config: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "model.bin").write_bytes(b"pretrained")
        hpckit.report({"loss": 2.0}, checkpoint=Checkpoint.from_directory(d))


def _hands_back_what_it_resumed_from(config: dict) -> None:
    checkpoint = hpckit.get_checkpoint()
    assert checkpoint is not None
    hpckit.report({"loss": 1.0}, checkpoint=checkpoint, checkpoint_upload_mode="async")


def test_another_experiments_checkpoint_handed_back_is_copied_and_stays_committed(tmp_path):
    """Fine-tuning from a committed checkpoint of another run, handed back ASYNC at once."""
    runs = tmp_path / "runs"
    pre = DataParallelTrainer(_reports, run_config=RunConfig(name="pre",
                                                             storage_path=str(runs))).fit()
    assert pre.checkpoint is not None
    before = _contents(runs / "pre")
    DataParallelTrainer(_hands_back_what_it_resumed_from, resume_from_checkpoint=Checkpoint(
        pre.checkpoint.path), run_config=RunConfig(name="fine", storage_path=str(runs))).fit()
    assert _contents(runs / "pre") == before
    assert run([HPCKIT, "verify", str(runs / "pre")], timeout=60).returncode == 0
    assert _contents(runs / "fine" / "checkpoint_000000") == {"model.bin": b"pretrained"}


def _hands_back_the_latest_each_step(config: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "model.bin").write_bytes(os.urandom(4 << 20))
        hpckit.report({"step": 0}, checkpoint=Checkpoint.from_directory(d))
    for step in range(1, 8):  # evaluation-only epochs: the same weights, reported again
        hpckit.report({"step": step}, checkpoint=hpckit.get_checkpoint(),
                      checkpoint_upload_mode=config["mode"])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_latest_checkpoint_handed_back_while_retention_evicts_it_is_still_copied(
        tmp_path, mode):
    """``num_to_keep=1``: with ASYNC, the checkpoint a report hands back is evicted by the
    commit of an earlier report's checkpoint at that report's own meeting. The hand-over reads
    it from links made before the ranks meet, so the run ends with the weights, and nothing of
    the links is left. (SYNC commits each before the next is handed: the same holds.)"""
    result = DataParallelTrainer(
        _hands_back_the_latest_each_step, train_loop_config={"mode": mode},
        run_config=RunConfig(name="e", storage_path=str(tmp_path),
                             checkpoint_config=CheckpointConfig(num_to_keep=1))).fit()
    assert result.checkpoint is not None and result.metrics["step"] == 7
    weights = Path(result.checkpoint.path, "model.bin")
    assert weights.stat().st_size == 4 << 20 and weights.stat().st_nlink == 1
    left = os.listdir(tmp_path / "e")
    assert [name for name in left if name.startswith("checkpoint_")] == ["checkpoint_000007"]
    assert ".staging" not in left
    assert run([HPCKIT, "verify", str(tmp_path / "e")], timeout=60).returncode == 0


def _hands_a_name_that_is_not_utf8(config: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "model.bin").write_bytes(b"weights")
        with open(os.path.join(os.fsencode(d), b"bad\xffname"), "wb") as f:
            f.write(b"x")
        hpckit.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_upload_mode=config["mode"])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_file_name_that_is_not_utf8_is_refused_at_report_naming_it(tmp_path, mode):
    """#51, item 6: it was committed, then verify called it "a bug in hpckit"."""
    with pytest.raises(hpckit.TrainingFailedError) as failed:
        DataParallelTrainer(_hands_a_name_that_is_not_utf8, train_loop_config={"mode": mode},
                            run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    assert "checkpoint file name 'bad\\udcffname'" in str(failed.value)
    assert "is not UTF-8" in str(failed.value)
    assert not list((tmp_path / "e").glob("checkpoint_*")), "a checkpoint was committed"


def test_metadata_of_a_committed_checkpoint_is_refused_and_the_checkpoint_stays_verified(
        tmp_path):
    """#51, item 4: it changed .metadata.json, verify failed, and the next run dropped the
    newest checkpoint. Before report(), on a directory of one's own, it works as in Ray."""
    result = DataParallelTrainer(_reports, run_config=RunConfig(
        name="e", storage_path=str(tmp_path))).fit()
    assert result.checkpoint is not None
    with pytest.raises(hpckit.errors.CheckpointError, match="is a committed checkpoint of"):
        result.checkpoint.update_metadata({"note": "best"})
    assert run([HPCKIT, "verify", str(tmp_path / "e")], timeout=60).returncode == 0
    copy = Checkpoint.from_directory(result.checkpoint.to_directory(str(tmp_path / "copy")))
    copy.update_metadata({"note": "best"})
    assert copy.get_metadata() == {"note": "best"}


def _reports_each_epoch(config: dict) -> None:
    start = 0
    if checkpoint := hpckit.get_checkpoint():
        start = int(Path(checkpoint.path, "epoch").read_text()) + 1
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "epoch").write_text(str(epoch))
            hpckit.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(d))


def test_a_lowered_next_checkpoint_index_never_overwrites_a_committed_checkpoint(tmp_path):
    """#51, item 8: the resume wrote over checkpoint_000001 and _000002, then wrote a manifest
    hpckit itself refused ("checkpoints lists an index twice")."""
    def fit(epochs: int) -> None:
        DataParallelTrainer(_reports_each_epoch, train_loop_config={"epochs": epochs},
                            run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()

    fit(3)
    path = tmp_path / "e" / "manifest.json"
    body = json.loads(path.read_text())
    body["next_checkpoint_index"] = 1
    path.write_text(json.dumps(body))
    committed = {name: _contents(tmp_path / "e" / name)
                 for name in ("checkpoint_000001", "checkpoint_000002")}
    fit(4)
    for name, contents in committed.items():
        assert _contents(tmp_path / "e" / name) == contents, name
    records = read_manifest(resolve(str(tmp_path / "e"))).checkpoints
    assert [r.directory for r in records][-1] == "checkpoint_000003"
    assert _contents(tmp_path / "e" / "checkpoint_000003")["epoch"] == b"3"


def test_a_damaged_record_file_takes_only_its_own_checkpoint_out_of_use(tmp_path, monkeypatch):
    """#51, item 9: verify and resume refused the whole experiment when one records/*.json
    was truncated, and the advice ("run `hpckit verify`") failed the same way. Now verify
    names the one checkpoint, the others export and resume, and no advice goes in a circle."""
    monkeypatch.setenv("HPCKIT_INLINE_RECORDS", "0")  # every checkpoint's records apart
    monkeypatch.setattr(settings, "_current", settings.Settings.read())

    def fit(epochs: int) -> None:
        DataParallelTrainer(_reports_each_epoch, train_loop_config={"epochs": epochs},
                            run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()

    fit(3)
    experiment = tmp_path / "e"
    truncated = experiment / "records" / "000002.json"
    truncated.write_bytes(truncated.read_bytes()[:20])
    checked = run([HPCKIT, "verify", str(experiment)], timeout=60, expect=1)
    bad = [line for line in checked.output.splitlines() if line.startswith("BAD")]
    assert len(bad) == 1 and bad[0].startswith(
        "BAD checkpoint_000002: its records cannot be used: records/000002.json does not match"
    ), checked.output
    run([HPCKIT, "export", str(experiment), str(tmp_path / "one"), "--index", "1"], timeout=60)
    assert (tmp_path / "one" / "epoch").read_text() == "1"
    refused = run([HPCKIT, "export", str(experiment), str(tmp_path / "two"), "--index", "2"],
                  timeout=60, expect=1)
    assert "hpckit: error: checkpoint_000002 cannot be exported: its records cannot be used" \
        in refused.output and "hpckit verify" not in refused.output, refused.output
    fit(4)  # resumes from checkpoint_000001, the newest that verifies
    records = read_manifest(resolve(str(experiment))).checkpoints
    assert [(r.directory, _contents(experiment / r.directory)["epoch"]) for r in records] == [
        ("checkpoint_000000", b"0"), ("checkpoint_000001", b"1"), ("checkpoint_000003", b"2"),
        ("checkpoint_000004", b"3")]
    run([HPCKIT, "verify", str(experiment)], timeout=60)


def test_gc_force_beside_a_live_run_leaves_its_pending_checkpoint_and_fences_it(tmp_path):
    """#51, item 7: ``hpckit gc --keep 1 --force`` beside a live run deleted checkpoints its
    manifest named and its pending directory, and the run died with a raw FileNotFoundError.
    Now gc takes the lock over (the run writes nothing more and fails with one line saying
    so), keeps what the running attempt may be writing, and the experiment stays whole."""
    command = [MPIEXEC, "-n", "2", sys.executable, str(HERE / "ranks" / "sharded.py"),
               "--storage", str(tmp_path), "--epochs", "400", "--epoch-seconds", "0.02"]
    live = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    experiment = tmp_path / "exp"
    pending = experiment / "checkpoint_000900"  # as the run's next checkpoint under way
    try:
        deadline = time.monotonic() + 60
        while not _committed(experiment, 3):
            assert live.poll() is None and time.monotonic() < deadline, live.communicate()[0]
            time.sleep(0.05)
        pending.mkdir()
        (pending / "part-0.bin").write_bytes(b"being written")
        gc = run([HPCKIT, "gc", "--keep", "1", "--force", str(experiment)], timeout=60)
        output, _ = live.communicate(timeout=120)
    finally:
        if live.poll() is None:
            os.killpg(live.pid, 9)
            live.wait()
    assert "kept checkpoint_000900" in gc.output, gc.output
    assert _contents(pending) == {"part-0.bin": b"being written"}
    assert live.returncode == 77, output
    errors = [line for line in output.splitlines() if "hpckit: error:" in line]
    assert len(errors) == 1 and "was taken over by another run" in errors[0], output
    assert "Traceback" not in output, output
    assert len(read_manifest(resolve(str(experiment))).checkpoints) == 1
    run([HPCKIT, "verify", str(experiment)], timeout=60)


def _committed(experiment: Path, count: int) -> bool:
    try:
        manifest = read_manifest(resolve(str(experiment)))
    except HpckitError:  # being replaced: read again
        return False
    return manifest is not None and manifest.next_checkpoint_index >= count


def _hands_what_it_is_given(config: dict) -> None:
    hpckit.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(config["handed"]),
                  checkpoint_upload_mode="async")


def test_an_experiment_inside_a_handed_directory_is_copied_never_taken(tmp_path):
    """Found by tests/test_fuzzed_trees.py: ASYNC took (moved, then deleted) the files of an
    experiment that a handed directory held; only the handed directory itself and those
    above it were asked whether they are an experiment's."""
    handed = tmp_path / "handed"
    handed.mkdir()
    (handed / "model.bin").write_bytes(b"w")
    DataParallelTrainer(_reports_each_epoch, train_loop_config={"epochs": 1},
                        run_config=RunConfig(name="inner", storage_path=str(handed))).fit()
    inner = _contents(handed / "inner")
    result = DataParallelTrainer(_hands_what_it_is_given, train_loop_config={"handed": str(handed)},
                                 run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    assert _contents(handed / "inner") == inner
    assert _contents(Path(result.checkpoint.path))["inner/manifest.json"] == inner["manifest.json"]
    run([HPCKIT, "verify", str(handed / "inner")], timeout=60)


def test_an_empty_handed_directory_commits_an_empty_checkpoint_directory(tmp_path):
    """Found by the fuzzed test: the checkpoint was committed without a directory."""
    (tmp_path / "empty").mkdir()
    result = DataParallelTrainer(
        _hands_what_it_is_given, train_loop_config={"handed": str(tmp_path / "empty")},
        run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    with result.checkpoint.as_directory() as directory:
        assert os.listdir(directory) == []


def test_to_directory_never_copies_into_an_experiment_or_onto_itself(tmp_path):
    """Found by the fuzzed test: a copy into its own experiment replaced the manifest with a
    checkpoint file of that name; one onto itself raised shutil.Error."""
    result = DataParallelTrainer(_reports_each_epoch, train_loop_config={"epochs": 1},
                                 run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    checkpoint = result.checkpoint
    for target, refusal in ((tmp_path / "e", "lies in experiment"),
                            (tmp_path / "e" / "checkpoint_000000", "inside the checkpoint"),
                            (tmp_path / "e" / "elsewhere", "lies in experiment")):
        with pytest.raises(CheckpointError, match=refusal):
            checkpoint.to_directory(target)
    assert _contents(Path(checkpoint.to_directory(tmp_path / "copy"))) == {"epoch": b"0"}
    run([HPCKIT, "verify", str(tmp_path / "e")], timeout=60)


def _hands_a_temporary_directory(config: dict) -> None:
    for epoch in range(config["epochs"]):
        d = tempfile.mkdtemp(dir=config["under"])
        Path(d, "model.bin").write_bytes(bytes([epoch]) * 10)
        hpckit.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_upload_mode="async")


def test_a_project_with_a_manifest_json_of_its_own_is_not_taken_for_an_experiment(tmp_path):
    """#65: a user's project with an unrelated ``manifest.json`` (a web app's, a dataset's):
    its temporary directories were kept for "in an experiment" (copied and leaked), and
    to_directory and hpckit export refused to write anywhere under it. hpckit knows an
    experiment by its own manifest, not by the file's name."""
    project = tmp_path / "project"
    (project / "scratch").mkdir(parents=True)
    (project / "manifest.json").write_text('{"name": "my project", "version": 2}\n')
    result = DataParallelTrainer(
        _hands_a_temporary_directory,
        train_loop_config={"epochs": 3, "under": str(project / "scratch")},
        run_config=RunConfig(name="e", storage_path=str(tmp_path / "runs"))).fit()
    assert list((project / "scratch").iterdir()) == [], "the handed directories leaked"
    copied = result.checkpoint.to_directory(str(project / "copy"))
    assert Path(copied, "model.bin").read_bytes() == bytes([2]) * 10
    run([HPCKIT, "export", str(tmp_path / "runs" / "e"), str(project / "exported")], timeout=60)
    assert (project / "exported" / "model.bin").read_bytes() == bytes([2]) * 10
    assert (project / "manifest.json").read_text() == '{"name": "my project", "version": 2}\n'
    # One that even lists a "checkpoints" entry of the name does not make its folder a
    # committed checkpoint, whose metadata could not change.
    listing = '{"checkpoints": [{"directory": "copy"}]}\n'
    (project / "manifest.json").write_text(listing)
    Checkpoint.from_directory(copied).update_metadata({"note": "mine"})
    assert Checkpoint.from_directory(copied).get_metadata() == {"note": "mine"}


def _hands_a_directory_of_the_run(config: dict) -> None:
    ctx = hpckit.get_context()
    handed = {"experiment": ctx.get_experiment_path(), "cwd": ".",
              "artifacts": os.path.join(ctx.get_experiment_path(), "artifacts", "mine"),
              "storage parent": os.path.dirname(ctx.get_storage_path())}[config["which"]]
    os.makedirs(handed, exist_ok=True)
    Path(handed, "model.bin").write_bytes(b"w")
    hpckit.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(handed),
                  checkpoint_upload_mode=config["mode"])


@pytest.mark.parametrize("which,said", [
    ("experiment", "which holds the experiment"),
    ("cwd", "which holds the storage path"),
    ("storage parent", "which holds the storage path"),
    ("artifacts", "inside the experiment's own artifacts/")])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_directory_that_holds_the_experiment_or_is_its_own_is_refused_at_report(
        tmp_path, monkeypatch, which, said, mode):
    """#65: handing get_experiment_path(), the working directory under a relative storage
    path, or a directory above the storage path nested the experiment (lock, manifest,
    staging, earlier checkpoints) in its own checkpoints, and the next report or resume
    failed with FileNotFoundError. Refused at report(), in one line naming the path; nothing
    of the user's changes."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "train.bin").write_bytes(b"data")
    monkeypatch.chdir(work)
    storage = "results" if which == "cwd" else str(work / "nested" / "runs")
    with pytest.raises(HpckitError) as refused:
        DataParallelTrainer(_hands_a_directory_of_the_run,
                            train_loop_config={"which": which, "mode": mode},
                            run_config=RunConfig(name="exp", storage_path=storage)).fit()
    message = str(refused.value)
    assert said in message and "\n" not in message, message
    assert (work / "data" / "train.bin").read_bytes() == b"data"
    experiment = work / storage / "exp"
    assert not [p for p in experiment.glob("checkpoint_*")], list(experiment.iterdir())
