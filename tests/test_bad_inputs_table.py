"""Bad inputs across the public API, the config objects, the environment and the CLI: each
gives a clear error naming the value, and nothing already stored changes."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import hpckit
from hpckit import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    HpckitError,
    Result,
    RunConfig,
    ScalingConfig,
)
from hpckit.cli import main
from hpckit.run.ranks import check_world as _check_world
from hpckit.settings import Settings
from hpckit.torch import load_state


def store_loop() -> None:
    for step in range(2):
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "w.npy"), np.arange(10.0) * step)
            hpckit.report({"loss": 1.0 / (step + 1)}, checkpoint=Checkpoint.from_directory(d))


@pytest.fixture(scope="session")  # computed once a worker, whatever the order of tests
def stored(tmp_path_factory):
    """An experiment with two committed checkpoints, which no bad input may change."""
    root = tmp_path_factory.mktemp("stored")
    DataParallelTrainer(store_loop, run_config=RunConfig(name="exp", storage_path=str(root))).fit()
    return root / "exp"


def report_in_a_run(root, metrics):
    def loop() -> None:
        hpckit.report(metrics)
    DataParallelTrainer(loop, run_config=RunConfig(name="other", storage_path=str(root))).fit()


def cli(*argv: str):
    return ("cli", argv)


E = "{exp}"  # replaced by the stored experiment's path

CASES = [
    # config: types and ranges
    (lambda e: ScalingConfig(num_workers=0), "num_workers=0"),
    (lambda e: ScalingConfig(num_workers="4"), "num_workers='4'"),
    (lambda e: ScalingConfig(use_gpu=1), "use_gpu=1"),
    (lambda e: ScalingConfig(resources_per_worker={"CPU": 0}), "['CPU']=0"),
    (lambda e: ScalingConfig(resources_per_worker={"CPU": 1.5}), "['CPU']=1.5"),
    (lambda e: CheckpointConfig(num_to_keep=-1), "num_to_keep=-1"),
    (lambda e: CheckpointConfig(checkpoint_score_order="MAX"), "'MAX'"),
    (lambda e: CheckpointConfig(checkpoint_score_attribute=""), "checkpoint_score_attribute=''"),
    (lambda e: CheckpointConfig(verify_on_resume=None), "verify_on_resume=None"),
    (lambda e: FailureConfig(max_failures=1.5), "max_failures=1.5"),
    (lambda e: RunConfig(name="a\\b"), "name='a\\\\b'"),
    (lambda e: RunConfig(storage_path=b"/tmp"), "storage_path=b'/tmp'"),
    (lambda e: RunConfig(checkpoint_config={"num_to_keep": 1}), "checkpoint_config={'num_to_keep': 1}"),
    # world sizes
    (lambda e: _check_world(2, ScalingConfig(num_workers=3), 0, Settings()), "num_workers=3) but 2 rank(s)"),
    (lambda e: _check_world(2, ScalingConfig(num_workers=2), 0, Settings(pmi_size="4")), "started 4 tasks but MPI sees a world of 2"),
    (lambda e: ScalingConfig(num_workers=(3, 2)), "num_workers=(3, 2)) is invalid: an elastic run needs 1 <= min_workers <= max_workers, such as (2, 3)"),
    (lambda e: ScalingConfig(num_workers=(0, 2)), "such as (1, 2)"),
    (lambda e: ScalingConfig(num_workers=(1, 2, 3)), "a tuple (min_workers, max_workers) of two integers"),
    (lambda e: ScalingConfig(num_workers=(1, 2.5)), "num_workers=(1, 2.5)) is invalid"),
    (lambda e: ScalingConfig(elastic_resize_monitor_interval_s=-1), "elastic_resize_monitor_interval_s=-1) must be a number of seconds >= 0"),
    # paths and URIs
    (lambda e: Checkpoint(""), "path=''"),
    (lambda e: Checkpoint.from_directory(e.parent / "absent"), "absent"),
    (lambda e: Checkpoint("nosuch://bucket/x"), "nosuch://bucket/x"),
    (lambda e: Checkpoint("s3://key:hunter2@bucket/x", filesystem=__import__("pyarrow.fs").fs.LocalFileSystem()),
     "s3://***@bucket/x"),
    (lambda e: Result.from_path(e.parent / "absent"), "absent"),
    (lambda e: load_state(Checkpoint(e / "checkpoint_000001"), "../w.npy"), "filename='../w.npy'"),
    (lambda e: load_state(Checkpoint(e / "checkpoint_000001"), "model.pt"), "no file 'model.pt'"),
    (lambda e: Checkpoint(e / "checkpoint_000001").set_metadata(["x"]), "got list"),
    # metrics
    (lambda e: report_in_a_run(e.parent, [("loss", 1)]), "must be a dict"),
    (lambda e: report_in_a_run(e.parent, {"loss": object()}), "metric 'loss'"),
    (lambda e: report_in_a_run(e.parent, {"t": torch.ones(3)}), "metric 't'"),
    # environment and signals
    (lambda e: Settings.read({"HPCKIT_STOP_SIGNAL": "SIGFOO"}), "HPCKIT_STOP_SIGNAL='SIGFOO'"),
    (lambda e: Settings.read({"HPCKIT_FAULT": "written:x:1"}), "HPCKIT_FAULT='written:x:1'"),
    (lambda e: Settings.read({"HPCKIT_LOCK_STALE_SECONDS": "never"}), "HPCKIT_LOCK_STALE_SECONDS='never'"),
    # the command line
    (cli("run", "-n", "0", "train.py"), "0 is not in the range"),
    (cli("resume", E, "-n", "-3"), "-3 is not in the range"),
    (cli("show", "/nonexistent/exp"), "/nonexistent/exp"),
    (cli("show", E, "checkpoint_999999"), "checkpoint_999999"),
    (cli("verify", E, "checkpoint_000042"), "checkpoint_000042"),
    (cli("export", E, "{tmp}/out", "--index", "42"), "42"),
    (cli("gc", E, "--keep", "0"), "0 is not in the range"),
    (cli("metrics", E, "--format", "xml"), "'xml' is not one of"),
    (cli("plot", E, "--metric", "nosuch", "-o", "{tmp}/p.png"), "nosuch"),
    (cli("ls", "s3://"), "s3://"),
]


def snapshot(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case,fragment", CASES, ids=[f"{i:02d}-{c[1]}"[:60] for i, c in enumerate(CASES)])
def test_bad_input_is_refused_naming_the_value(stored, tmp_path, case, fragment):
    before = snapshot(stored)
    if isinstance(case, tuple):
        argv = [a.replace(E, str(stored)).replace("{tmp}", str(tmp_path)) for a in case[1]]
        result = CliRunner().invoke(main, argv)
        assert result.exit_code != 0, f"hpckit {' '.join(argv)} succeeded:\n{result.output}"
        message = result.output
    else:
        with pytest.raises((HpckitError, ValueError, TypeError)) as info:
            case(stored)
        message = str(info.value)
    assert fragment in message, f"the error does not name the value ({fragment!r}):\n{message}"
    assert snapshot(stored) == before, "a refused input changed what was stored"


def test_the_table_covers_at_least_thirty_inputs():
    assert len(CASES) >= 30
