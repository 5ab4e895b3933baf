"""hpckit.torch.save_state: torch.save into the pending checkpoint, training blocked only for
a copy into staging memory. The kill harness (test_kill.py) kills ranks at its phases."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import pytest
import torch

import hpckit
from hpckit import CheckpointConfig, RunConfig
from hpckit.integrations.torch import save as _save
from hpckit.torch import TorchTrainer, load_state, save_state


def model_state(seed: int) -> OrderedDict:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(),
                               torch.nn.Linear(4, 2)).state_dict()


def hold_the_writer() -> threading.Event:
    """Queue a task ahead of the next save's write: the write starts once the event is set."""
    release = threading.Event()
    _save._writer.submit(release.wait, 30)
    return release


def changed_after_save(config: dict) -> None:
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        model.weight.grad = torch.ones_like(model.weight)
        model.bias.grad = torch.ones_like(model.bias)
        optimizer.step()
        torch.save({"model": model.state_dict(), "step": step}, f"{config['expected']}-{step}.pt")
        release = hold_the_writer()
        checkpoint = save_state({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                 "step": step, "note": ["kept", step]}, "state.pt")
        with torch.no_grad():
            model.weight.mul_(-7.0)  # at once, while the write waits behind the held task
            model.bias.zero_()
        release.set()
        hpckit.report({"step": step}, checkpoint=checkpoint,
                      checkpoint_upload_mode=config["mode"])
        with torch.no_grad():
            model.weight.div_(-7.0)  # undo, so the next step trains on what was saved


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_what_save_state_saved_is_the_state_when_it_returned(tmp_path, mode):
    expected = str(tmp_path / "expected")
    result = TorchTrainer(changed_after_save, train_loop_config={"mode": mode, "expected": expected},
                          run_config=RunConfig(name="e", storage_path=str(tmp_path),
                                               checkpoint_config=CheckpointConfig())).fit()
    assert result.error is None
    for step in range(3):
        directory = tmp_path / "e" / f"checkpoint_{step:06d}"
        saved = torch.load(directory / "state.pt")  # a plain torch.save file
        want = torch.load(f"{expected}-{step}.pt")
        assert saved["step"] == step and saved["note"] == ["kept", step]
        for name, tensor in want["model"].items():
            assert torch.equal(saved["model"][name], tensor), (step, name)
        assert set(saved["optimizer"]["state"]) == {0, 1}
        checked = load_state(hpckit.Checkpoint(str(directory)))  # checked against the manifest
        assert torch.equal(checked["model"]["weight"], want["model"]["weight"])


def saves_twice(config: dict) -> None:
    state = {"a": torch.arange(6.0).reshape(2, 3), "b": [torch.zeros(4), 3]}
    first = save_state(state, "s.pt")
    pointers = {key: buffer.data_ptr() for key, buffer in _save._staging["s.pt"].buffers.items()}
    state["a"] += 1
    hpckit.report({"i": 0}, checkpoint=first, checkpoint_upload_mode="async")
    second = save_state(state, "s.pt")
    again = {key: buffer.data_ptr() for key, buffer in _save._staging["s.pt"].buffers.items()}
    hpckit.report({"i": 1}, checkpoint=second, checkpoint_upload_mode="async")
    config["pointers"].append((pointers, again))


def test_staging_memory_is_allocated_once_and_reused(tmp_path):
    seen: list = []
    TorchTrainer(saves_twice, train_loop_config={"pointers": seen},
                 run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    (first, second), = seen
    assert first == second and len(first) == 2, "each tensor keeps its buffer between saves"
    one = torch.load(tmp_path / "e" / "checkpoint_000000" / "s.pt")
    two = torch.load(tmp_path / "e" / "checkpoint_000001" / "s.pt")
    assert torch.equal(one["a"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(two["a"], torch.arange(6.0).reshape(2, 3) + 1)
    assert two["b"][1] == 3 and type(model_state(0)) is OrderedDict


def unsafe_name(config: dict) -> None:
    save_state({"x": torch.zeros(1)}, "../outside.pt")


def test_a_file_name_outside_the_checkpoint_is_refused(tmp_path):
    with pytest.raises(hpckit.TrainingFailedError,
                       match=r"CheckpointError: save_state\(filename='../outside.pt'\)"):
        TorchTrainer(unsafe_name, run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    assert not (tmp_path / "e" / "outside.pt").exists()


def test_outside_a_run_save_state_says_where_to_call_it():
    with pytest.raises(hpckit.HpckitError, match="inside the training function"):
        save_state({"x": torch.zeros(1)})


def test_in_a_shared_directory_a_file_still_being_saved_is_hashed_by_its_own_rank(tmp_path):
    """Three ranks' view of one pending checkpoint: rank 1's save is still writing a.pt when
    the others hash their shares, so only rank 1 may hash it (once its write is done)."""
    from hpckit.run.commit.planning import unrecorded
    from hpckit.run.writing.plan import Persisted
    from hpckit.run.writing.shares import sync_in_place
    from hpckit.storage.copy import checksum_of
    from hpckit.storage.location import local

    pending = tmp_path / "checkpoint_000000"
    pending.mkdir()
    for name, size in (("b.pt", 3000), ("c.pt", 2000), ("d.pt", 1000)):
        (pending / name).write_bytes(bytes([len(name)]) * size)
    (pending / "a.pt").write_bytes(b"partial")  # what ranks 0 and 2 see of rank 1's save
    target, later = local(str(pending)), {1: ("a.pt",)}
    early = [sync_in_place(str(pending), target, rank, 3, later=later) for rank in (0, 2)]
    (pending / "a.pt").write_bytes(b"the whole file, once rank 1's save is done")
    own = sync_in_place(str(pending), target, 1, 3, later=later)
    per_rank: list[Persisted] = [early[0], own, early[1]]
    by_rank = {rank: sorted(r.path for r in p.records) for rank, p in enumerate(per_rank)}
    assert "a.pt" in by_rank[1] and all("a.pt" not in by_rank[r] for r in (0, 2))
    assert sorted(sum(by_rank.values(), [])) == ["a.pt", "b.pt", "c.pt", "d.pt"]
    record = next(r for r in own.records if r.path == "a.pt")
    assert record.checksum == checksum_of(b"the whole file, once rank 1's save is done")
    assert unrecorded(per_rank) == []


def in_the_way(name: str) -> None:
    """A file where a save of ``name/...`` needs a directory: that save's write fails."""
    directory = hpckit.get_context().get_checkpoint_dir()
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, name), "w").close()


def saved_again_before_a_report(config: dict) -> None:
    in_the_way("blocked")
    save_state({"x": torch.zeros(1)}, "blocked/s.pt")  # fails in the background
    save_state({"x": torch.ones(1)}, "blocked/s.pt")


def test_a_failed_write_that_no_report_took_fails_the_next_save_of_the_file(tmp_path):
    with pytest.raises(hpckit.TrainingFailedError) as raised:
        TorchTrainer(saved_again_before_a_report,
                     run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    message = str(raised.value)
    assert "save_state could not write" in message and "blocked/s.pt" in message, message
    assert "no report() took that checkpoint" in message, message


def two_saves_fail(config: dict) -> None:
    in_the_way("one")
    in_the_way("two")
    save_state({"x": torch.zeros(1)}, "one/s.pt")
    checkpoint = save_state({"x": torch.zeros(1)}, "two/s.pt")
    hpckit.report({"i": 0}, checkpoint=checkpoint)


def test_report_tells_every_failed_write_of_its_checkpoint(tmp_path):
    with pytest.raises(hpckit.TrainingFailedError) as raised:
        TorchTrainer(two_saves_fail, run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    message = str(raised.value)
    assert "2 writes into checkpoint" in message, message
    assert "one/s.pt" in message and "two/s.pt" in message, message
