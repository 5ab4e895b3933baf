"""A flipped byte or a truncated file in a committed checkpoint is caught by checksum: on
resume (which then starts from the newest checkpoint that verifies, loudly), by
``hpckit verify``, and by ``hpckit.torch.load_state``."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from conftest import HERE, HPCKIT, checkpoint_dirs, manifest, mpiexec, run

import hpckit
from hpckit import Checkpoint, CheckpointConfig, RunConfig
from hpckit.errors import CheckpointError
from hpckit.torch import TorchTrainer, load_state

SHARDED = HERE / "ranks" / "sharded.py"


def sharded(storage, epochs: int, *extra: str, expect: int | None = 0):
    return mpiexec(3, "--storage", str(storage), "--epochs", str(epochs), "--keep", "10", *extra,
                   script=SHARDED, expect=expect, timeout=90)


def flip_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def final(out) -> list[str]:
    line = out.line("FINAL")
    assert line is not None, out.output
    return json.loads(line)["shards"]


def test_resume_skips_a_damaged_checkpoint_loudly_and_ends_like_an_uninterrupted_run(tmp_path):
    reference = final(sharded(tmp_path / "reference", 6))
    sharded(tmp_path, 4)
    exp = tmp_path / "exp"
    flip_byte(exp / "checkpoint_000003" / "state-rank1.npy")
    with open(exp / "checkpoint_000002" / "momentum-rank2.npy", "r+b") as f:
        f.truncate(100)

    check = run([HPCKIT, "verify", str(exp)], timeout=60, expect=1)
    assert re.search(r"checkpoint_000003/state-rank1.npy: checksum xxh3-128", check.output), check.output
    assert re.search(r"checkpoint_000002/momentum-rank2.npy: size 100", check.output), check.output

    out = sharded(tmp_path, 6)
    text = re.sub(r"\[\d+\] ", "", out.output)
    assert re.search(r"checkpoint_000003 is DAMAGED .*state-rank1.npy: checksum xxh3-128", text), text
    assert re.search(r"checkpoint_000002 is DAMAGED .*momentum-rank2.npy: size 100", text), text
    assert re.search(r"resuming experiment \S+ from checkpoint_000001", text), text
    assert final(out) == reference
    steps = [json.loads(l)["step"] for l in (exp / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(6))
    assert "checkpoint_000002" not in checkpoint_dirs(exp)
    assert run([HPCKIT, "verify", str(exp)], timeout=60).returncode == 0


def test_when_no_checkpoint_verifies_the_run_stops_and_changes_nothing(tmp_path):
    sharded(tmp_path, 2)
    exp = tmp_path / "exp"
    for d in checkpoint_dirs(exp):
        flip_byte(exp / d / "meta.json")
    before = (exp / "manifest.json").read_bytes()
    out = sharded(tmp_path, 4, expect=None)
    assert out.returncode != 0
    assert "no committed checkpoint" in out.output and "verifies" in out.output, out.output
    assert (exp / "manifest.json").read_bytes() == before
    assert checkpoint_dirs(exp) == ["checkpoint_000000", "checkpoint_000001"]


def test_verification_can_be_turned_off(tmp_path):
    with pytest.raises(hpckit.ConfigError, match="verify_on_resume='no'"):
        CheckpointConfig(verify_on_resume="no")
    sharded(tmp_path, 2)
    flip_byte(tmp_path / "exp" / "checkpoint_000001" / "state-rank0.npy")
    out = sharded(tmp_path, 3, "--no-verify")
    assert "DAMAGED" not in out.output
    assert re.search(r"resuming experiment \S+ from checkpoint_000001", out.output), out.output


def save_loop(config):
    with __import__("tempfile").TemporaryDirectory() as d:
        torch.save(config["state"], os.path.join(d, "state.pt"))
        hpckit.report({"x": 1}, checkpoint=Checkpoint.from_directory(d))


class Opaque:
    """Not a tensor or a plain container: weights-only loading refuses it."""


def committed(tmp_path, state) -> Checkpoint:
    result = TorchTrainer(save_loop, train_loop_config={"state": state},
                          run_config=RunConfig(name="load", storage_path=str(tmp_path))).fit()
    assert result.checkpoint is not None
    return result.checkpoint


def test_load_state_checks_the_manifest_and_loads_weights_only(tmp_path):
    checkpoint = committed(tmp_path, {"w": torch.arange(1000.0)})
    assert torch.equal(load_state(checkpoint)["w"], torch.arange(1000.0))
    flip_byte(tmp_path / "load" / "checkpoint_000000" / "state.pt")
    with pytest.raises(CheckpointError, match=r"state.pt is damaged: checksum xxh3-128 .* older checkpoint"):
        load_state(checkpoint)
    with pytest.raises(CheckpointError, match="has no file 'model.pt'; it holds state.pt"):
        load_state(checkpoint, "model.pt")
    with pytest.raises(CheckpointError, match=r"filename='../x'"):
        load_state(checkpoint, "../x")


def test_load_state_refuses_pickled_objects_unless_asked(tmp_path):
    checkpoint = committed(tmp_path, {"w": torch.ones(2), "extra": Opaque()})
    with pytest.raises(CheckpointError, match="weights-only loading refuses .* weights_only=False"):
        load_state(checkpoint)
    assert isinstance(load_state(checkpoint, weights_only=False)["extra"], Opaque)
    assert manifest(tmp_path / "load")["latest"] == "checkpoint_000000"
