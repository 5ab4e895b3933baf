"""The hpckit inspection commands, on a local and an S3 experiment."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import hpckit
from hpckit import Checkpoint, CheckpointConfig, RunConfig
from hpckit.cli import main
from hpckit.storage.uris import parent
from hpckit import DataParallelTrainer


def loop(config):
    for epoch, loss in enumerate([0.5, 0.2, 0.4]):
        d = Path(config["tmp"]) / str(epoch)
        d.mkdir()
        (d / "w.bin").write_bytes(b"x" * (epoch + 1) * 100)
        hpckit.report({"loss": loss, "acc": 1 - loss, "epoch": epoch},
                      checkpoint=Checkpoint.from_directory(d))


def make(storage: str, tmp: Path) -> None:
    DataParallelTrainer(loop, train_loop_config={"tmp": str(tmp)},
                 run_config=RunConfig(name="e", storage_path=storage, checkpoint_config=CheckpointConfig(
                     checkpoint_score_attribute="loss", checkpoint_score_order="min"))).fit()


@pytest.fixture(params=["local", "s3"])
def experiment(request, tmp_path):
    """(experiment path or URI, a function that returns a stored file's bytes, and one that
    overwrites it, and one that deletes it)."""
    if request.param == "local":
        make(str(tmp_path / "s"), tmp_path)
        exp = tmp_path / "s" / "e"
        def write_local(rel, data):
            (exp / rel).parent.mkdir(parents=True, exist_ok=True)
            (exp / rel).write_bytes(data)

        return (str(exp), lambda rel: (exp / rel).read_bytes(), write_local,
                lambda rel: (exp / rel).unlink())
    s3 = request.getfixturevalue("s3")
    prefix = f"cli-{tmp_path.name}"
    make(s3.uri(prefix), tmp_path)
    fs = s3.filesystem()
    key = f"hpckit/{prefix}/e/"

    def write(rel, data):
        with fs.open_output_stream(key + rel) as f:
            f.write(data)

    return (s3.uri(f"{prefix}/e"), lambda rel: fs.open_input_stream(key + rel).read(), write,
            lambda rel: fs.delete_file(key + rel))


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_ls_marks_latest_and_best_and_filters_metrics(experiment):
    path = experiment[0]
    rows = json.loads(invoke("ls", "--json", path).output)
    assert [(r["directory"], r["bytes"], r["latest"], r["best"]) for r in rows] == [
        ("checkpoint_000000", 100, False, False), ("checkpoint_000001", 200, False, True),
        ("checkpoint_000002", 300, True, False)]
    table = invoke("ls", "--metric", "loss", path).output.splitlines()
    assert table[0].split() == ["CHECKPOINT", "STEP", "REPORTED", "SIZE", "loss"]
    assert table[2].startswith(" +  checkpoint_000001") and table[3].startswith("*   checkpoint_000002")
    assert table[2].split()[-3:] == ["200", "B", "0.2"] and "acc" not in table[0]


def test_show_experiment_and_checkpoint(experiment):
    path = experiment[0]
    out = invoke("show", path).output
    attempts = out.splitlines()[out.splitlines().index("attempts:") + 1:]
    assert attempts[0].split()[:3] == ["#", "STATUS", "STARTED"]
    assert attempts[1].split()[:2] == ["0", "finished"] and len(attempts) == 2
    assert "world size 1" in out and '"num_to_keep": null' in out
    by_name, by_index = invoke("show", path, "checkpoint_000001"), invoke("show", path, "1")
    assert by_name.output == by_index.output
    assert by_name.output.splitlines()[-1].split()[:4] == ["w.bin", "200", "B", "0"]
    record = json.loads(invoke("show", "--json", path, "2").output)
    assert record["files"][0]["size"] == 300 and record["files"][0]["checksum"].startswith("xxh3-128:")
    missing = CliRunner().invoke(main, ["show", path, "checkpoint_000009"])
    assert missing.exit_code == 2 and "no committed checkpoint 'checkpoint_000009'" in missing.output


def test_verify_catches_a_flipped_byte_a_truncation_and_a_missing_file(experiment):
    path, read, write, delete = experiment
    ok = invoke("verify", path)
    assert ok.exit_code == 0 and "ok: 3 file(s) in 3 checkpoint(s)" in ok.output
    data = bytearray(read("checkpoint_000000/w.bin"))
    data[10] ^= 0xFF
    write("checkpoint_000000/w.bin", bytes(data))
    write("checkpoint_000001/w.bin", read("checkpoint_000001/w.bin")[:-1])
    delete("checkpoint_000002/w.bin")
    bad = CliRunner().invoke(main, ["verify", path])
    assert bad.exit_code == 1
    lines = [l for l in bad.output.splitlines() if l.startswith("BAD")]
    assert lines[0].startswith("BAD checkpoint_000000/w.bin: checksum xxh3-128 ")
    assert lines[1] == "BAD checkpoint_000001/w.bin: size 199, manifest says 200"
    assert lines[2] == "BAD checkpoint_000002/w.bin: missing"
    assert CliRunner().invoke(main, ["verify", path, "checkpoint_000000"]).exit_code == 1


def as_written_before_checksums(manifest_path: Path) -> None:
    """Rewrite a manifest as hpckit wrote it before format 3: a bare SHA-256 per file."""
    body = json.loads(manifest_path.read_text())
    body["format_version"] = 1
    for record in body["checkpoints"]:
        for f in record["files"]:
            data = (manifest_path.parent / record["directory"] / f["path"]).read_bytes()
            del f["checksum"]
            f["sha256"] = hashlib.sha256(data).hexdigest()
    manifest_path.write_text(json.dumps(body))


def test_a_sha256_manifest_still_verifies_resumes_and_keeps_its_checksums(tmp_path):
    make(str(tmp_path / "s"), tmp_path)
    exp = tmp_path / "s" / "e"
    as_written_before_checksums(exp / "manifest.json")
    ok = invoke("verify", str(exp))
    assert "ok: 3 file(s) in 3 checkpoint(s) match the manifest (3 by sha256)" in ok.output

    def resumed(config):
        with hpckit.get_checkpoint().as_directory() as d:
            assert (Path(d) / "w.bin").read_bytes() == b"x" * 300
        d = Path(config["tmp"]) / "3"
        d.mkdir()
        (d / "w.bin").write_bytes(b"y" * 400)
        hpckit.report({"loss": 0.1}, checkpoint=Checkpoint.from_directory(d))

    DataParallelTrainer(resumed, train_loop_config={"tmp": str(tmp_path)},
                 run_config=RunConfig(name="e", storage_path=str(tmp_path / "s"))).fit()
    body = json.loads((exp / "manifest.json").read_text())
    assert body["format_version"] == 3
    checksums = [r["files"][0]["checksum"] for r in body["checkpoints"]]
    assert [c.split(":")[0] for c in checksums] == ["sha256"] * 3 + ["xxh3-128"]
    assert checksums[0] == "sha256:" + hashlib.sha256(b"x" * 100).hexdigest()
    ok = invoke("verify", str(exp))
    assert "ok: 4 file(s) in 4 checkpoint(s) match the manifest (3 by sha256, 1 by xxh3-128)" \
        in ok.output, ok.output
    (exp / "checkpoint_000001" / "w.bin").write_bytes(b"x" * 199 + b"z")
    bad = CliRunner().invoke(main, ["verify", str(exp)])
    assert bad.exit_code == 1 and "BAD checkpoint_000001/w.bin: checksum sha256 " in bad.output


def test_metrics_in_every_format(experiment):
    path = experiment[0]
    rows = list(csv.reader(io.StringIO(invoke("metrics", "--format", "csv", path).output)))
    assert rows[0] == ["step", "time", "checkpoint", "loss", "acc", "epoch"]
    assert [r[3] for r in rows[1:]] == ["0.5", "0.2", "0.4"] and rows[3][2] == "checkpoint_000002"
    assert [e["step"] for e in json.loads(invoke("metrics", "--format", "json", path).output)] == [0, 1, 2]
    table = invoke("metrics", path).output.splitlines()
    assert table[0].split() == ["step", "time", "checkpoint", "loss", "acc", "epoch"] and len(table) == 4


COMMANDS = {"ls": [], "show": [], "verify": [], "metrics": [], "resume": [], "gc": [],
            "export": ["DEST"], "plot": ["--metric", "loss", "-o", "x.png"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("where", ["not-an-experiment", "missing"])
def test_commands_on_a_path_that_is_not_an_experiment(tmp_path, command, where):
    path = tmp_path if where == "not-an-experiment" else tmp_path / "no" / "such"
    out = CliRunner().invoke(main, [command, str(path), *COMMANDS[command]])
    assert out.exit_code == 2 and "not an hpckit experiment" in out.output, out.output
    assert out.output.startswith("hpckit: error: ") and out.output.count("\n") == 1, out.output


def test_a_bad_option_is_one_line_as_every_other_failure():
    """#42's audit: a path that is not an experiment was printed as click's usage block while
    hpckit's own errors were one 'hpckit: error:' line: the same failure, two ways."""
    for words, said in ((["ls", "--nope"], "No such option '--nope' (see hpckit ls --help)."),
                        (["nosuch"], "No such command 'nosuch' (see hpckit --help)."),
                        (["--nope"], "No such option '--nope' (see hpckit --help).")):
        out = CliRunner().invoke(main, words, prog_name="hpckit")
        assert out.exit_code == 2 and out.output == f"hpckit: error: {said}\n", out.output


def test_the_installed_entry_point_runs(tmp_path):
    make(str(tmp_path / "s"), tmp_path)
    out = subprocess.run([Path(sys.executable).parent / "hpckit", "ls", str(tmp_path / "s" / "e")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "*   checkpoint_000002" in out.stdout
    usage = subprocess.run([Path(sys.executable).parent / "hpckit", "--help"], capture_output=True,
                           text=True).stdout
    assert all(f"  {c} " in usage for c in ("ls", "show", "verify", "metrics", "run", "resume"))


def _dirs(path: str) -> list[str]:
    return [r["directory"] for r in json.loads(invoke("ls", "--json", path).output)]


def test_gc_dry_run_deletes_nothing_and_gc_removes_evicted_and_leftovers(experiment):
    path, read, write, _ = experiment
    write("checkpoint_000007/partial.bin", b"p" * 50)  # what a crashed commit leaves
    dry = invoke("gc", "--keep", "1", "--dry-run", path)
    assert "would remove checkpoint_000000 (100 B, evicted by retention)" in dry.output
    assert "would remove checkpoint_000007 (50 B, named by no manifest)" in dry.output
    assert "would remove 2 checkpoint(s), 150 B (dry run: nothing was deleted)" in dry.output
    assert _dirs(path) == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    assert read("checkpoint_000000/w.bin") == b"x" * 100 and read("checkpoint_000007/partial.bin")
    done = invoke("gc", "--keep", "1", path)
    assert "removed 2 checkpoint(s), 150 B freed" in done.output
    assert _dirs(path) == ["checkpoint_000001", "checkpoint_000002"]  # the best and the latest
    with pytest.raises(OSError):
        read("checkpoint_000000/w.bin")
    with pytest.raises(OSError):
        read("checkpoint_000007/partial.bin")
    assert invoke("verify", path).exit_code == 0


def test_gc_without_keep_says_that_it_keeps_every_committed_checkpoint(experiment):
    path, read, write, _ = experiment
    write("checkpoint_000007/partial.bin", b"p" * 50)
    done = invoke("gc", path)
    assert done.output.startswith("no --keep: every committed checkpoint is kept"), done.output
    assert "removed checkpoint_000007 (50 B, named by no manifest)" in done.output
    assert _dirs(path) == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]


def test_gc_refuses_a_running_experiment(tmp_path):
    make(str(tmp_path / "s"), tmp_path)
    manifest_path = tmp_path / "s" / "e" / "manifest.json"
    body = json.loads(manifest_path.read_text())
    body["attempts"][-1]["status"] = "running"
    manifest_path.write_text(json.dumps(body))
    out = CliRunner().invoke(main, ["gc", "--keep", "1", str(tmp_path / "s" / "e")])
    assert out.exit_code == 2 and "looks running" in out.output
    assert len(json.loads(manifest_path.read_text())["checkpoints"]) == 3
    forced = invoke("gc", "--keep", "1", "--force", str(tmp_path / "s" / "e"))
    assert "removed 1 checkpoint(s), 100 B freed" in forced.output
    assert len(json.loads(manifest_path.read_text())["checkpoints"]) == 2


def test_export_copies_and_verifies(experiment, tmp_path):
    path, read, write, _ = experiment
    best = invoke("export", "--best", path, str(tmp_path / "best"))
    assert "exported checkpoint_000001 (1 file(s), 200 B, verified)" in best.output
    assert (tmp_path / "best" / "w.bin").read_bytes() == b"x" * 200
    invoke("export", "--index", "0", path, str(tmp_path / "first"))
    assert (tmp_path / "first" / "w.bin").read_bytes() == b"x" * 100
    invoke("export", "--latest", path, str(tmp_path / "last"))
    assert (tmp_path / "last" / "w.bin").read_bytes() == b"x" * 300
    write("checkpoint_000002/w.bin", b"y" * 300)
    bad = CliRunner().invoke(main, ["export", path, str(tmp_path / "latest")])
    assert bad.exit_code == 1 and "does not match the manifest" in bad.output
    assert not (tmp_path / "latest" / "w.bin").exists()


def test_export_into_an_experiment_is_refused_and_its_checkpoints_still_verify(experiment,
                                                                              tmp_path):
    """#51, item 3: onto itself the copy truncated the file it read, then deleted it."""
    path, read, _, _ = experiment
    before = read("checkpoint_000002/w.bin")
    base, _, query = path.partition("?")
    for target in (f"{base}/{name}" + (f"?{query}" if query else "")
                   for name in ("checkpoint_000002", "elsewhere")):
        refused = CliRunner().invoke(main, ["export", path, target])
        assert refused.exit_code == 1 and "lies inside an experiment" in refused.output, \
            refused.output
    assert read("checkpoint_000002/w.bin") == before
    assert CliRunner().invoke(main, ["verify", path]).exit_code == 0


def test_export_into_another_experiment_is_refused(experiment, tmp_path):
    path, _, _, _ = experiment
    other = tmp_path / "other"
    other.mkdir()  # an experiment: hpckit's own manifest (a file merely so named is none)
    (other / "manifest.json").write_text('{"format": "hpckit.manifest", "format_version": 8}')
    refused = CliRunner().invoke(main, ["export", path, str(other / "checkpoint_000000")])
    assert refused.exit_code == 1 and "lies inside an experiment" in refused.output
    assert sorted(p.name for p in other.iterdir()) == ["manifest.json"]


def test_ls_of_a_storage_root_lists_experiments(experiment):
    root, _ = parent(experiment[0])
    rows = json.loads(invoke("ls", "--json", root).output)
    assert [(r["experiment"], r["status"], r["checkpoints"]) for r in rows] == [("e", "finished", 3)]
    assert rows[0]["last_metrics"]["epoch"] == 2
    header, row = invoke("ls", root).output.splitlines()
    assert header.startswith("EXPERIMENT ") and row.startswith("e ")
    typo = root.replace("?", "/typo?", 1) if "?" in root else f"{root}/typo"
    missing = invoke("ls", "--root", typo)
    assert missing.exit_code == 2 and "/typo" in missing.output, missing.output
    assert "does not exist; check the path" in missing.output, missing.output


def test_metrics_dataframe(experiment):
    table = hpckit.Result.from_path(experiment[0]).metrics_dataframe
    assert table.column_names == ["step", "time", "checkpoint", "loss", "acc", "epoch"]
    assert table.column("loss").to_pylist() == [0.5, 0.2, 0.4]
    assert hpckit.Result.from_path(experiment[0]).get_best_checkpoint("acc").path.endswith(
        "checkpoint_000001")


def _reports_hpckits_own_names(config: dict) -> None:
    hpckit.report({"step": 7, "time": "late", "checkpoint": "mine", "loss": 0.5,
                   "lst": [1, {"y": 2.0}], "opt": {"lr": 0.1, "betas": [0.9, 0.99]}})


def test_metrics_named_like_hpckits_columns_are_kept_apart_and_lists_are_json(tmp_path):
    """#51, item 13: the header read step,time,checkpoint,step,time,checkpoint,loss, the
    dataframe's step held the user's values, a mixed list raised ArrowInvalid, and nested
    values reached the CSV as Python's repr."""
    result = hpckit.DataParallelTrainer(_reports_hpckits_own_names, run_config=hpckit.RunConfig(
        name="e", storage_path=str(tmp_path))).fit()
    columns = ["step", "time", "checkpoint", "metrics/step", "metrics/time",
               "metrics/checkpoint", "loss", "lst", "opt/lr", "opt/betas"]
    table = result.metrics_dataframe
    assert table.column_names == columns
    assert table.column("step").to_pylist() == [0]
    assert table.column("metrics/step").to_pylist() == [7]
    assert json.loads(table.column("lst").to_pylist()[0]) == [1, {"y": 2.0}]
    rows = list(csv.reader(io.StringIO(invoke("metrics", "--format", "csv",
                                              str(tmp_path / "e")).output)))
    assert rows[0] == columns
    assert rows[1][0] == "0" and rows[1][3:8] == ["7", "late", "mine", "0.5", '[1, {"y": 2.0}]']
    assert json.loads(rows[1][9]) == [0.9, 0.99]


def test_plot_writes_a_png_of_the_expected_size_with_curves(experiment, tmp_path):
    import matplotlib.image

    path = experiment[0]
    out = invoke("plot", path, path, "--metric", "loss", "--metric", "acc", "--x", "epoch",
                 "-o", str(tmp_path / "curves.png"))
    assert out.exit_code == 0, out.output
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.shape[:2] == (600, 800)  # 2 panels of 8x3 inches at 100 dpi
    ink = (image[:, :, :3] < 0.9).any(axis=2).mean()
    colours = len({tuple(p) for p in (image[:, :, :3] * 255).astype(int).reshape(-1, 3)[::7]})
    assert ink > 0.02 and colours > 20  # axes, labels and coloured curves, not a blank image
    bad = CliRunner().invoke(main, ["plot", path, "--metric", "nope", "-o", str(tmp_path / "x.png")])
    assert bad.exit_code == 2 and "no experiment reported a numeric metric 'nope'" in bad.output


def test_an_unexpected_error_says_where_to_report_it_and_what_to_send(tmp_path, monkeypatch):
    from hpckit.cli import listing

    def broken(root):
        raise RuntimeError("a defect")

    monkeypatch.setattr(listing, "list_experiments", broken)
    out = CliRunner().invoke(main, ["ls", "--root", str(tmp_path)])
    clone = Path(__file__).resolve().parent.parent  # hpckit runs from this clone
    assert out.exit_code == 1, out.output
    assert out.output.startswith("hpckit: error: unexpected RuntimeError: a defect (this is a bug in hpckit; "
                                 "report it on the issue tracker of the repository hpckit was cloned "
                                 f"from (git -C {clone} remote -v names it) with the command"), out.output
    assert "python -m hpckit doctor" in out.output
