"""Exact resume (#52): every rank's loader position and random streams are saved with every
checkpoint and restored at the first ``get_checkpoint()``, so that a run killed and restarted
mid-epoch ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
from conftest import HERE, manifest, python
from torch.utils.data import DataLoader, Dataset

from hpckit.integrations.torch import streams
from hpckit.integrations.torch.prepare import prepare_data_loader

EXACT = HERE / "ranks" / "exact.py"


class Noisy(Dataset):
    """Each sample draws from the process's streams, as an augmentation does."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, torch.rand(()).item() + random.random() + float(np.random.rand())


def _draws() -> tuple[float, float, float]:
    return torch.rand(()).item(), random.random(), float(np.random.rand())


@pytest.mark.quick
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_loader_put_back_mid_pass_continues_it_and_the_random_streams_as_uninterrupted(
        workers, shuffle):
    def loader():
        return prepare_data_loader(DataLoader(Noisy(), batch_size=3, shuffle=shuffle,
                                              num_workers=workers))

    torch.manual_seed(1)
    first = loader()
    batches = iter(first)
    before = [next(batches), next(batches)]
    saved, kept = first.state_dict(), streams.snapshot()
    rest, after = [b[0].tolist() for b in batches], _draws()

    torch.manual_seed(99)
    again = loader()
    again.load_state_dict(saved)
    streams.put_back(kept)
    continued = [b[0].tolist() for b in again]
    assert len(before) == 2 and continued == rest
    assert _draws() == after  # with no workers the samples drew from these streams too
    assert again.epoch == first.epoch


@pytest.mark.quick
def test_a_pass_that_ended_before_the_checkpoint_is_not_continued():
    first = prepare_data_loader(DataLoader(Noisy(), batch_size=4, shuffle=True))
    list(first)
    saved = first.state_dict()
    again = prepare_data_loader(DataLoader(Noisy(), batch_size=4, shuffle=True))
    again.load_state_dict(saved)
    assert sum(len(b[0]) for b in again) == 10


def _final(output: str) -> list[str]:
    found = re.search(r"FINAL (\{[^{}]*\})", output)
    assert found is not None, f"training did not finish:\n{output}"
    return json.loads(found.group(1))["params"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow sqlite store for the module (making one costs seconds of migrations)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    MlflowClient(uri).search_experiments()
    return uri


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, store) -> list[str]:
    storage = tmp_path_factory.mktemp("uninterrupted")
    return _final(python("--storage", str(storage), "--name", "ref", "--mlflow", store,
                         script=EXACT).output)


def _logged(uri: str, experiment: str) -> tuple[str, list[tuple[int, float]]]:
    """The one MLflow run of ``experiment``: its status and its loss at each step."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    history = client.get_metric_history(run.info.run_id, "loss")
    return run.info.status, sorted((m.step, m.value) for m in history)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_two_ranks_killed_mid_epoch_at_different_steps_end_bit_identical(
        tmp_path, uninterrupted, store, mode):
    """The issue's test: the parameters bit-identical to an uninterrupted run's, and MLflow
    holding one run with every step logged once, its values the uninterrupted run's."""
    markers = tmp_path / "markers"
    markers.mkdir()
    name = f"killed-{mode}"
    run = python("--storage", str(tmp_path), "--name", name, "--mode", mode, "--markers",
                 str(markers), "--kill", "1:12", "--kill", "0:17", "--mlflow", store,
                 script=EXACT, timeout=240)
    assert sorted(p.name for p in markers.iterdir()) == ["0-17", "1-12"], run.output
    attempts = manifest(tmp_path / name)["attempts"]
    assert len(attempts) == 3, attempts
    resumed_from = re.findall(r"resuming experiment \S+ from (checkpoint_\d+)", run.output)
    # each restart from a checkpoint taken mid-epoch (every 5 steps, 8 batches an epoch):
    # ASYNC steps 5 and 10, SYNC (committed at once) steps 10 and 15
    assert len(resumed_from) == 2 and resumed_from[0] < resumed_from[1], run.output
    assert _final(run.output) == uninterrupted
    status, history = _logged(store, name)
    assert status == "FINISHED"
    assert [step for step, _ in history] == list(range(1, 25))
    assert history == _logged(store, "ref")[1]


def test_without_exact_resume_the_same_kills_end_elsewhere(tmp_path, uninterrupted):
    """The check above can fail: without the saved state, the restarted run differs."""
    markers = tmp_path / "markers"
    markers.mkdir()
    run = python("--storage", str(tmp_path), "--name", "e", "--exact", "off", "--mode", "sync",
                 "--markers", str(markers), "--kill", "1:12", script=EXACT, timeout=240)
    assert "from checkpoint_000001" in run.output, run.output  # step 10's, mid-epoch
    assert _final(run.output) != uninterrupted
