"""The hpckit command (more commands come with the CLI issue)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import hpckit
from hpckit import Checkpoint, RunConfig
from hpckit.cli import main
from hpckit.torch import TorchTrainer


def loop(config):
    for epoch in range(3):
        d = Path(config["tmp"]) / str(epoch)
        d.mkdir()
        (d / "w.bin").write_bytes(b"x" * (epoch + 1))
        hpckit.report({"loss": 1.0 / (epoch + 1)}, checkpoint=Checkpoint.from_directory(d))


def test_ls_lists_committed_checkpoints(tmp_path):
    TorchTrainer(loop, train_loop_config={"tmp": str(tmp_path)},
                 run_config=RunConfig(name="e", storage_path=str(tmp_path / "s"))).fit()
    out = CliRunner().invoke(main, ["ls", "--json", str(tmp_path / "s" / "e")])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(r["directory"], r["bytes"], r["latest"]) for r in rows] == [
        ("checkpoint_000000", 1, False), ("checkpoint_000001", 2, False), ("checkpoint_000002", 3, True)]
    table = subprocess.run([Path(sys.executable).parent / "hpckit", "ls", str(tmp_path / "s" / "e")],
                           capture_output=True, text=True)
    assert table.returncode == 0 and "* checkpoint_000002" in table.stdout


def test_ls_on_a_path_that_is_not_an_experiment(tmp_path):
    out = CliRunner().invoke(main, ["ls", str(tmp_path)])
    assert out.exit_code == 2 and "not an hpckit experiment" in out.output
