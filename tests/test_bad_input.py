"""Bad input gets a clear error naming the value, before any work starts; nothing stored is lost."""

from __future__ import annotations

import json
import os
import sys

import pyarrow.fs
import pytest
from conftest import JOB, run

import hpckit
from hpckit import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from hpckit.errors import (
    CheckpointError,
    ConfigError,
    HpckitError,
    ManifestError,
    MetricsError,
    StorageError,
    TrainingFailedError,
)
from hpckit.torch import TorchTrainer


@pytest.mark.parametrize("make,fragment", [
    (lambda: ScalingConfig(num_workers=0), "num_workers=0"),
    (lambda: ScalingConfig(num_workers=2.5), "num_workers=2.5"),
    (lambda: ScalingConfig(use_gpu="yes"), "use_gpu='yes'"),
    (lambda: ScalingConfig(resources_per_worker={"TPU": 1}), "unknown resource 'TPU'"),
    (lambda: ScalingConfig(resources_per_worker={"GPU": 1}), "use_gpu=False"),
    (lambda: ScalingConfig(use_gpu=True, resources_per_worker={"GPU": -1}), "['GPU']=-1"),
    (lambda: CheckpointConfig(num_to_keep=0), "num_to_keep=0"),
    (lambda: CheckpointConfig(num_to_keep=True), "num_to_keep=True"),
    (lambda: CheckpointConfig(checkpoint_score_order="best"), "'best'"),
    (lambda: CheckpointConfig(checkpoint_score_attribute=3), "checkpoint_score_attribute=3"),
    (lambda: FailureConfig(max_failures=-2), "max_failures=-2"),
    (lambda: RunConfig(name="a/b"), "name='a/b'"),
    (lambda: RunConfig(name=".."), "name='..'"),
    (lambda: RunConfig(name=""), "name=''"),
    (lambda: RunConfig(storage_path=""), "storage_path=''"),
    (lambda: RunConfig(storage_path=5), "storage_path=5"),
    (lambda: RunConfig(storage_path="s3://b/p", storage_filesystem=pyarrow.fs.LocalFileSystem()),
     "has a scheme"),
    (lambda: RunConfig(storage_filesystem="/tmp"), "pyarrow.fs.FileSystem"),
    (lambda: TorchTrainer(5), "train_loop_per_worker=5"),
    (lambda: TorchTrainer(lambda a, b: None), "one argument"),
    (lambda: TorchTrainer(lambda: None, train_loop_config=[1]), "train_loop_config=[1]"),
    (lambda: TorchTrainer(lambda: None, scaling_config={"num_workers": 2}), "ScalingConfig"),
])
def test_config_errors_name_the_value(make, fragment):
    with pytest.raises(ConfigError) as info:
        make()
    assert fragment in str(info.value)


def _fit(storage, loop=None, **run) -> hpckit.Result:
    ran = []

    def default_loop():
        ran.append(True)
        hpckit.report({"x": 1})

    result = TorchTrainer(loop or default_loop, run_config=RunConfig(
        name="exp", storage_path=str(storage), **run)).fit()
    return result


def test_storage_path_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("data")
    with pytest.raises(StorageError, match=f"storage path {path} is a file"):
        _fit(path, loop=_must_not_run)
    assert path.read_text() == "data"


def _must_not_run():
    raise AssertionError("training started despite bad input")


def test_storage_path_that_is_not_writable(tmp_path):
    if os.geteuid() != 0:
        os.chmod(tmp_path, 0o500)
        with pytest.raises(StorageError, match="permission denied"):
            _fit(tmp_path / "runs", loop=_must_not_run)
        return
    # Root ignores permission bits: make the filesystem itself read-only, in a private mount.
    command = (f"mount --bind {tmp_path} {tmp_path} && mount -o remount,bind,ro {tmp_path} && "
               f"exec {sys.executable} {JOB} --storage {tmp_path}/runs")
    out = run(["unshare", "-m", "sh", "-c", command], timeout=60, expect=3)
    assert f"cannot create directory {tmp_path}/runs/exp" in out.output
    assert "Read-only file system" in out.output


def test_storage_not_visible_from_every_node_is_refused(tmp_path):
    """Rank 1 runs in a private mount namespace where the storage path is another filesystem,
    as a node-local /tmp would be on a second node."""
    storage = tmp_path / "runs"
    storage.mkdir()
    wrapper = tmp_path / "rank.sh"
    wrapper.write_text(
        f'if [ "$PMI_RANK" = 1 ]; then exec unshare -m sh -c "mount -t tmpfs none {storage} && '
        f'exec {sys.executable} {JOB} --storage {storage}"; fi\n'
        f"exec {sys.executable} {JOB} --storage {storage}\n")
    out = run([os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "2", "sh",
               str(wrapper)], timeout=60, expect=3)
    assert "rank 1 on" in out.output and "not shared by every node" in out.output
    assert not any(p.name.startswith("checkpoint_") for p in (storage / "exp").iterdir())


def test_manifest_from_a_newer_hpckit_is_refused_and_kept(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    body = {"format": "hpckit.manifest", "format_version": 99}
    (exp / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(ManifestError, match="format_version 99.*Upgrade hpckit"):
        _fit(tmp_path, loop=_must_not_run)
    assert json.loads((exp / "manifest.json").read_text()) == body


def test_corrupt_manifest_is_an_error_and_never_overwritten(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "manifest.json").write_bytes(b'{"format": "hpckit.manifest", "checkp')
    (exp / "checkpoint_000000").mkdir()
    with pytest.raises(ManifestError, match="not valid JSON.*never overwrites"):
        _fit(tmp_path, loop=_must_not_run)
    assert (exp / "manifest.json").read_bytes() == b'{"format": "hpckit.manifest", "checkp'
    assert (exp / "checkpoint_000000").is_dir()


def test_manifest_with_a_wrong_field_names_it(tmp_path):
    _fit(tmp_path)
    path = tmp_path / "exp" / "manifest.json"
    body = json.loads(path.read_text())
    body["next_step"] = "three"
    path.write_text(json.dumps(body))
    with pytest.raises(ManifestError, match="field next_step: expected int, got str"):
        _fit(tmp_path, loop=_must_not_run)


@pytest.mark.parametrize("metrics,fragment", [
    ([("loss", 1)], "must be a dict"),
    ({"loss": object()}, "metric 'loss'"),
    ({"nested": {"bad": {1, 2}}}, "metric 'nested/bad'"),
    ({3: 1.0}, "metric key 3"),
])
def test_bad_metrics_fail_the_report_naming_the_key(tmp_path, metrics, fragment):
    with pytest.raises(TrainingFailedError, match="MetricsError") as info:
        _fit(tmp_path, loop=lambda: hpckit.report(metrics))
    assert fragment in str(info.value)
    assert not any(p.name.startswith("checkpoint_") for p in (tmp_path / "exp").iterdir())


def test_checkpoint_directory_that_does_not_exist_or_is_a_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        Checkpoint.from_directory(tmp_path / "missing")
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        Checkpoint.from_directory(tmp_path / "f")


def test_report_with_something_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(TrainingFailedError, match="must be an hpckit.Checkpoint"):
        _fit(tmp_path, loop=lambda: hpckit.report({}, checkpoint=str(tmp_path)))


@pytest.mark.parametrize("call", [lambda: hpckit.report({"a": 1}), hpckit.get_checkpoint,
                                  hpckit.get_context])
def test_api_outside_a_training_run(call):
    with pytest.raises(HpckitError, match="outside a training run"):
        call()


def test_metrics_errors_are_typed():
    from hpckit.experiment.values import to_json_metrics

    with pytest.raises(MetricsError):
        to_json_metrics({"x": object()})
