"""The hpckit inspection commands, on a local and an S3 experiment."""

from __future__ import annotations

import csv
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
from hpckit.torch import TorchTrainer


def loop(config):
    for epoch, loss in enumerate([0.5, 0.2, 0.4]):
        d = Path(config["tmp"]) / str(epoch)
        d.mkdir()
        (d / "w.bin").write_bytes(b"x" * (epoch + 1) * 100)
        hpckit.report({"loss": loss, "acc": 1 - loss, "epoch": epoch},
                      checkpoint=Checkpoint.from_directory(d))


def make(storage: str, tmp: Path) -> None:
    TorchTrainer(loop, train_loop_config={"tmp": str(tmp)},
                 run_config=RunConfig(name="e", storage_path=storage, checkpoint_config=CheckpointConfig(
                     checkpoint_score_attribute="loss", checkpoint_score_order="min"))).fit()


@pytest.fixture(params=["local", "s3"])
def experiment(request, tmp_path):
    """(experiment path or URI, a function that returns a stored file's bytes, and one that
    overwrites it, and one that deletes it)."""
    if request.param == "local":
        make(str(tmp_path / "s"), tmp_path)
        exp = tmp_path / "s" / "e"
        return (str(exp), lambda rel: (exp / rel).read_bytes(),
                lambda rel, data: (exp / rel).write_bytes(data), lambda rel: (exp / rel).unlink())
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
    assert table[1].startswith(" + checkpoint_000001") and table[2].startswith("*  checkpoint_000002")
    assert '{"loss": 0.2}' in table[1] and "acc" not in table[1]


def test_show_experiment_and_checkpoint(experiment):
    path = experiment[0]
    out = invoke("show", path).output
    assert "world size 1" in out and "attempt 0: finished" in out and '"num_to_keep": null' in out
    by_name, by_index = invoke("show", path, "checkpoint_000001"), invoke("show", path, "1")
    assert by_name.output == by_index.output and "w.bin" in by_name.output and "rank 0" in by_name.output
    record = json.loads(invoke("show", "--json", path, "2").output)
    assert record["files"][0]["size"] == 300 and len(record["files"][0]["sha256"]) == 64
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
    assert lines[0].startswith("BAD checkpoint_000000/w.bin: sha256")
    assert lines[1] == "BAD checkpoint_000001/w.bin: size 199, manifest says 200"
    assert lines[2] == "BAD checkpoint_000002/w.bin: missing"
    assert CliRunner().invoke(main, ["verify", path, "checkpoint_000000"]).exit_code == 1


def test_metrics_in_every_format(experiment):
    path = experiment[0]
    rows = list(csv.reader(io.StringIO(invoke("metrics", "--format", "csv", path).output)))
    assert rows[0] == ["step", "time", "checkpoint", "loss", "acc", "epoch"]
    assert [r[3] for r in rows[1:]] == ["0.5", "0.2", "0.4"] and rows[3][2] == "checkpoint_000002"
    assert [e["step"] for e in json.loads(invoke("metrics", "--format", "json", path).output)] == [0, 1, 2]
    table = invoke("metrics", path).output.splitlines()
    assert table[0].split() == ["step", "time", "checkpoint", "loss", "acc", "epoch"] and len(table) == 4


@pytest.mark.parametrize("command", ["ls", "show", "verify", "metrics", "resume"])
def test_commands_on_a_path_that_is_not_an_experiment(tmp_path, command):
    out = CliRunner().invoke(main, [command, str(tmp_path)])
    assert out.exit_code == 2 and "not an hpckit experiment" in out.output


def test_the_installed_entry_point_runs(tmp_path):
    make(str(tmp_path / "s"), tmp_path)
    out = subprocess.run([Path(sys.executable).parent / "hpckit", "ls", str(tmp_path / "s" / "e")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "*  checkpoint_000002" in out.stdout
    usage = subprocess.run([Path(sys.executable).parent / "hpckit", "--help"], capture_output=True,
                           text=True).stdout
    assert all(f"  {c} " in usage for c in ("ls", "show", "verify", "metrics", "run", "resume"))
