"""A newcomer's first session: attempts numbered across runs, and `hpckit ls` with no argument
listing the experiments under the default storage path, newest first, with a header."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import HPCKIT

from hpckit import DataParallelTrainer, RunConfig


def _run_twice(storage: str, name: str) -> None:
    for _ in range(2):
        DataParallelTrainer(lambda: None, run_config=RunConfig(name=name, storage_path=storage)).fit()


def test_attempts_are_numbered_across_runs(tmp_path):
    _run_twice(str(tmp_path), "twice")
    attempts = json.loads((tmp_path / "twice" / "manifest.json").read_text())["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [(0, "finished"), (1, "finished")]
    shown = subprocess.run([HPCKIT, "show", str(tmp_path / "twice")], capture_output=True,
                           text=True, timeout=60)
    assert "attempt 0: finished" in shown.stdout and "attempt 1: finished" in shown.stdout


def test_ls_without_an_argument_lists_the_default_storage_newest_first(tmp_path):
    _run_twice(str(tmp_path), "older")
    DataParallelTrainer(lambda: None, run_config=RunConfig(name="newer", storage_path=str(tmp_path))).fit()
    env = {**os.environ, "HPCKIT_STORAGE": str(tmp_path)}
    out = subprocess.run([HPCKIT, "ls"], capture_output=True, text=True, timeout=60, env=env)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0].split() == ["EXPERIMENT", "STATUS", "ATTEMPTS",
                                                        "CHECKPOINTS", "LATEST", "UPDATED"]
    assert [line.split()[:3] for line in lines[1:]] == [["newer", "finished", "1"],
                                                        ["older", "finished", "2"]]
    home = tmp_path / "home"
    home.mkdir()
    empty = subprocess.run([HPCKIT, "ls"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "HOME": str(home), "HPCKIT_STORAGE": ""})
    assert empty.returncode == 0 and empty.stdout.strip() == \
        f"no experiments under {home / 'hpckit_results'} yet"


def _history(values: list[float]) -> list[dict]:
    return [{"step": i, "metrics": {"loss": v, "epoch": i}} for i, v in enumerate(values)]


def test_plots_have_a_title_labels_a_legend_whole_epochs_and_a_log_scale_where_needed():
    import matplotlib.pyplot as plt

    from hpckit.cli.plot import figure

    falling = _history([100 * 0.3 ** i for i in range(12)])  # over six decades
    narrow = _history([0.5, 0.4, 0.45])
    fig = figure([("run-a", falling)], ["loss"], "epoch")
    try:
        ax = fig.axes[0]
        assert fig._suptitle.get_text() == "loss by epoch: run-a"
        assert ax.get_yscale() == "log" and ax.get_ylabel() == "loss" and ax.get_xlabel() == "epoch"
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["run-a"]
        fig.canvas.draw()
        assert all(float(t).is_integer() for t in ax.get_xticks())
    finally:
        plt.close(fig)
    for data, log, scale in ((narrow, None, "linear"), (narrow, True, "log"), (falling, False, "linear")):
        fig = figure([("run-b", data)], ["loss"], "step", log)
        try:
            assert fig.axes[0].get_yscale() == scale
        finally:
            plt.close(fig)
