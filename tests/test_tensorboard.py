"""TensorBoard events when the package is installed; nothing breaks without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import hpckit
from hpckit import RunConfig
from hpckit.torch import TorchTrainer


def loop():
    for step, loss in enumerate([0.9, 0.5, 0.25]):
        hpckit.report({"loss": loss, "val": {"acc": 1 - loss}, "note": "text is skipped"})


@pytest.fixture
def default_events(monkeypatch):
    """The product's default (events on), which the rest of the suite turns off."""
    monkeypatch.delenv("HPCKIT_TENSORBOARD", raising=False)


def test_every_report_writes_scalars_that_tensorboard_reads(tmp_path, default_events):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    TorchTrainer(loop, run_config=RunConfig(name="tb", storage_path=str(tmp_path))).fit()
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["loss", "val/acc"]
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("loss")] == [(0, 0.9), (1, 0.5), (2, 0.25)]


def test_without_tensorboard_training_still_works(tmp_path, default_events):
    script = textwrap.dedent(f"""
        import sys
        sys.modules["tensorboard"] = None  # as if the package were not installed
        import hpckit
        from hpckit import RunConfig
        from hpckit.torch import TorchTrainer

        def loop():
            hpckit.report({{"loss": 1.0}})

        TorchTrainer(loop, run_config=RunConfig(name="plain", storage_path={str(tmp_path)!r})).fit()
        print("TRAINED")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "TRAINED" in out.stdout, out.stderr
    assert (tmp_path / "plain" / "metrics.jsonl").exists()
    assert not (tmp_path / "plain" / "tensorboard").exists()


def test_events_of_an_s3_experiment_land_in_its_directory(s3, tmp_path, default_events):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpckit import Checkpoint

    TorchTrainer(loop, run_config=RunConfig(name="tb", storage_path=s3.uri(f"tb-{tmp_path.name}"))).fit()
    Checkpoint(s3.uri(f"tb-{tmp_path.name}/tb/tensorboard")).to_directory(str(tmp_path / "events"))
    events = EventAccumulator(str(tmp_path / "events"))
    events.Reload()
    assert [round(e.value, 3) for e in events.Scalars("val/acc")] == [0.1, 0.5, 0.75]


def test_hpckit_tensorboard_0_turns_the_events_off(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCKIT_TENSORBOARD", "0")
    hpckit.DataParallelTrainer(lambda: hpckit.report({"loss": 1.0}),
                               run_config=RunConfig(name="quiet", storage_path=str(tmp_path))).fit()
    assert (tmp_path / "quiet" / "metrics.jsonl").exists()
    assert not (tmp_path / "quiet" / "tensorboard").exists()
