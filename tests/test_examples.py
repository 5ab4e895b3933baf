"""The examples in examples/ run as the README says, train, and resume."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import checkpoint_dirs, manifest, metrics_lines, run

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_linear_example_trains_and_resumes(tmp_path):
    args = [sys.executable, str(EXAMPLES / "linear.py"), "--workers", "2", "--storage", str(tmp_path)]
    first = run([*args, "--epochs", "3"], timeout=120)
    assert "final loss" in first.output
    second = run([*args, "--epochs", "5"], timeout=120)
    assert "resuming experiment" in second.output and "from checkpoint_000002" in second.output
    exp = tmp_path / "linear"
    assert [line["metrics"]["epoch"] for line in metrics_lines(exp)] == [0, 1, 2, 3, 4]
    losses = [line["metrics"]["loss"] for line in metrics_lines(exp)]
    assert losses[-1] < losses[0] / 4
    assert manifest(exp)["latest"] == "checkpoint_000004"


def test_fashion_hdf5_example_learns_well_above_chance(tmp_path):
    out = run([sys.executable, str(EXAMPLES / "fashion_hdf5.py"), "--workers", "2", "--epochs", "2",
               "--storage", str(tmp_path), "--data", str(tmp_path / "fashion.h5")], timeout=240)
    accuracy = float(re.search(r"accuracy (\d\.\d+) after epoch 1", out.output).group(1))
    assert accuracy > 0.5, out.output  # chance is 0.1
    exp = tmp_path / "fashion-hdf5"
    assert checkpoint_dirs(exp) == ["checkpoint_000000", "checkpoint_000001"]
    best = manifest(exp)["retention"]
    assert best == {"num_to_keep": 2, "checkpoint_score_attribute": "accuracy",
                    "checkpoint_score_order": "max"}
    last = json.loads((exp / "metrics.jsonl").read_text().splitlines()[-1])["metrics"]
    assert last["accuracy"] == pytest.approx(accuracy, abs=5e-4)
