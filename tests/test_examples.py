"""The examples in examples/ run as the README says, train, and resume."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import HPCKIT, MPIEXEC, checkpoint_dirs, manifest, metrics_lines, run

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_the_readme_try_it_sequence_then_hpckit_resume(tmp_path):
    """The README's "Try it" commands as written (storage under a fresh HOME), then
    ``hpckit resume``, which repeats the latest run: 3 ranks, 10 epochs. The first two are
    docs/getting-started.md's first run and its resume, checked here."""
    env = {"HOME": str(tmp_path), "HPCKIT_STORAGE": ""}
    linear = [sys.executable, str(EXAMPLES / "linear.py")]
    first = run([*linear, "--workers", "2"], timeout=120, env=env)
    assert first.output.count("final loss") == 1
    second = run([*linear, "--workers", "2", "--epochs", "8"], timeout=120, env=env)
    assert "resuming experiment" in second.output and "from checkpoint_000004" in second.output
    third = run([MPIEXEC, "-n", "3", *linear, "--workers", "3", "--epochs", "10"], timeout=120,
                env=env)
    assert third.output.count("final loss") == 1  # the Result is printed by rank 0 only
    exp = tmp_path / "hpckit_results" / "linear"
    resumed = run([HPCKIT, "resume", str(exp)], timeout=120, env=env)
    assert "with 3 rank(s): examples/linear.py --workers 3 --epochs 10" in \
        resumed.output.replace(str(EXAMPLES.parent) + "/", ""), resumed.output
    assert [line["metrics"]["epoch"] for line in metrics_lines(exp)] == list(range(10))
    losses = [line["metrics"]["loss"] for line in metrics_lines(exp)]
    assert losses[-1] < losses[0] / 4
    body = manifest(exp)
    assert body["latest"] == "checkpoint_000009" and body["world_size"] == 3
    assert [(a["attempt"], a["status"], a["launcher"], a["world_size"]) for a in body["attempts"]] \
        == [(0, "finished", "hpckit", 2), (1, "finished", "hpckit", 2),
            (2, "finished", "mpiexec", 3), (3, "finished", "mpiexec", 3)]
    shown = run([HPCKIT, "show", str(exp)], timeout=60).output
    assert "train_loop_config.epochs: 5 -> 8" in shown
    assert "train_loop_config.epochs: 8 -> 10; scaling_config.num_workers: 2 -> 3" in shown


README_PLACEHOLDERS = """
import torch


def build_model():
    return torch.nn.Linear(4, 1)


def build_loader():
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    return torch.utils.data.DataLoader(data, batch_size=16)


def train_one_epoch(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return loss.item()

"""


def test_the_readme_snippet_runs_as_written_and_resumes(tmp_path):
    readme = (EXAMPLES.parent / "README.md").read_text()
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    for placeholder in ("build_model()", "build_loader()", "train_one_epoch(model, loader)"):
        assert placeholder in snippet
    for mine, here in (('"/lustre/project/runs"', repr(str(tmp_path))), ("num_workers=4", "num_workers=2"),
                       ('{"epochs": 10}', '{"epochs": 3}')):
        assert mine in snippet, f"the README snippet no longer has {mine}"
        snippet = snippet.replace(mine, here)
    script = tmp_path / "train.py"
    script.write_text(README_PLACEHOLDERS + snippet)
    run([sys.executable, str(script)], timeout=120)
    exp = tmp_path / "resnet"
    assert manifest(exp)["latest"] == "checkpoint_000002"
    # What a spare node needs: restarts allowed (the newcomer's first example once lacked it).
    assert manifest(exp)["config"]["failure_config"]["max_failures"] == 3
    script.write_text(README_PLACEHOLDERS + snippet.replace('{"epochs": 3}', '{"epochs": 4}'))
    again = run([sys.executable, str(script)], timeout=120)
    assert "from checkpoint_000002" in again.output, again.output
    assert [line["metrics"]["epoch"] for line in metrics_lines(exp)] == [0, 1, 2, 3]


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
