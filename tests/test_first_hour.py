"""A newcomer's first session: attempts numbered across runs, `hpckit ls` with no argument,
tables a person reads, `hpckit resume` continuing what it names, an honest start-up log, and
plots with titles and scales."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import HPCKIT, manifest, run

import hpckit
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
    rows = shown.stdout.split("attempts:\n")[1].splitlines()[1:]
    assert [row.split()[:2] for row in rows] == [["0", "finished"], ["1", "finished"]]


def test_ls_without_an_argument_lists_the_default_storage_newest_first(tmp_path):
    _run_twice(str(tmp_path), "older")
    DataParallelTrainer(lambda: None, run_config=RunConfig(name="newer", storage_path=str(tmp_path))).fit()
    env = {**os.environ, "HPCKIT_STORAGE": str(tmp_path)}
    out = subprocess.run([HPCKIT, "ls"], capture_output=True, text=True, timeout=60, env=env)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0].split() == ["EXPERIMENT", "STATUS", "ATTEMPTS", "STEP",
                                                        "BEST", "LATEST", "UPDATED", "SIZE"]
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

    from hpckit.cli.inspect import figure

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


NEWCOMER = Path(__file__).parent / "ranks" / "newcomer.py"


def test_hpckit_resume_continues_the_experiment_it_names_and_says_so(tmp_path):
    run([sys.executable, str(NEWCOMER), "--storage", str(tmp_path), "--name", "a", "--workers", "1",
         "--steps", "2"], timeout=90)
    # The script now names another experiment; hpckit resume a still continues a.
    out = run([HPCKIT, "resume", str(tmp_path / "a")], timeout=90,
              env={"NEWCOMER_NAME": "b"})
    said = [line for line in out.output.splitlines() if "hpckit resume continues" in line]
    assert len(said) == 1 and f"continues {tmp_path / 'a'}, not {tmp_path / 'b'}" in said[0], out.output
    assert not (tmp_path / "b").exists()
    assert [a["status"] for a in manifest(tmp_path / "a")["attempts"]] == ["finished", "finished"]
    assert "outside any Slurm allocation" not in out.output, "one rank on this node: no warning"
    recorded = json.loads((tmp_path / "a" / "manifest.json").read_text())
    recorded["attempts"][-1]["launcher"] = "srun"  # as a job step would have recorded it
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(recorded))
    out = run([HPCKIT, "resume", str(tmp_path / "a")], timeout=90)
    assert "starting all 1 rank(s) on this node" in out.output and \
        "its last attempt ran under srun" in out.output and "--sbatch FILE" in out.output, out.output


def test_to_resume_is_said_once_when_no_restart_follows(tmp_path):
    out = run([HPCKIT, "run", "-n", "2", "--max-failures", "1", str(NEWCOMER), "--storage",
               str(tmp_path), "--fail"], timeout=120, expect=1)
    said = "training failed; to resume from its last committed checkpoint, run the same command again"
    assert out.output.count(said) == 1, out.output
    assert [a["status"] for a in manifest(tmp_path / "newcomer")["attempts"]] == ["failed", "failed"]


def test_ready_in_counts_from_the_start_of_the_command(tmp_path):
    out = run([sys.executable, str(NEWCOMER), "--storage", str(tmp_path), "--steps", "1",
               "--before-fit", "1.5"], timeout=90)
    ready = re.search(r"ready in (\d+\.\d+) s since the command started", out.output)
    assert ready and float(ready.group(1)) >= 1.5, out.output


def test_importing_the_torch_face_imports_neither_torch_nor_dcp():
    code = ("import sys; from hpckit.torch import TorchTrainer; "
            "assert 'torch' not in sys.modules, 'torch'; "
            "from hpckit.torch import prepare_model, load_state, HDF5Dataset; "
            "assert 'torch.distributed.checkpoint' not in sys.modules, 'dcp'; "
            "import hpckit.torch as t; names = [getattr(t, n) for n in t.__all__]; "
            "assert 'torch.distributed.checkpoint' in sys.modules; print(len(names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "12", out.stderr


def test_cli_tables_round_floats_show_times_and_sizes_and_json_is_exact(tmp_path):
    def loop() -> None:
        with tempfile.TemporaryDirectory() as d:
            Path(d, "w.bin").write_bytes(b"x" * 3000)
            hpckit.report({"loss": 100.82398080825806}, checkpoint=hpckit.Checkpoint.from_directory(d))

    DataParallelTrainer(loop, run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    experiment = str(tmp_path / "e")
    header, row = _hpckit("metrics", experiment).splitlines()
    assert header.split() == ["step", "time", "checkpoint", "loss"]
    assert re.fullmatch(r"0  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  checkpoint_000000  100\.824", row.strip())
    assert json.loads(_hpckit("metrics", "--format", "json", experiment))[0]["metrics"]["loss"] == \
        100.82398080825806
    assert _hpckit("ls", experiment).splitlines()[1].split()[5:] == ["2.9", "KiB", "100.824"]
    listed = json.loads(_hpckit("ls", "--json", "--root", str(tmp_path)))
    assert listed[0]["bytes"] == 3000 and listed[0]["last_step"] == 0


def _hpckit(*args: str) -> str:
    out = subprocess.run([HPCKIT, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_table_piped_into_head_ends_quietly(tmp_path):
    # 3000 lines (over 100 KiB) outlast the 64 KiB pipe: head closes it while hpckit writes.
    DataParallelTrainer(lambda: [hpckit.report({"loss": float(i)}) for i in range(3000)],
                        run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    out = subprocess.run(f"set -o pipefail; {HPCKIT} metrics {tmp_path / 'e'} | head -n 2",
                         shell=True, executable="/bin/bash", capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.splitlines()[0].split() == ["step", "time", "checkpoint", "loss"]
    assert out.returncode == 141 and out.stderr == "", out.stderr


def test_a_training_function_under_the_main_guard_is_named_with_the_fix(tmp_path):
    """`python train.py` with the training function defined inside `if __name__ ==
    "__main__":`: the ranks, which import the script without running that block, cannot
    unpickle it. One line names it and the fix, instead of 'no rank reported an exception'
    after two tracebacks."""
    script = tmp_path / "train.py"
    script.write_text(
        "import hpckit\n"
        "from hpckit import DataParallelTrainer, RunConfig, ScalingConfig\n\n"
        "if __name__ == '__main__':\n"
        "    def train_loop(config):\n"
        "        hpckit.report({'loss': 1.0})\n\n"
        "    DataParallelTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2),\n"
        f"                        run_config=RunConfig(storage_path={str(tmp_path)!r})).fit()\n")
    out = run([sys.executable, str(script)], timeout=90, expect=1)
    lines = out.output.strip().splitlines()
    assert len(lines) == 1, out.output
    assert lines[0].startswith(f"hpckit: error: the ranks cannot find train_loop in {script}: ")
    assert "Define train_loop at module level, outside that block" in lines[0], out.output
