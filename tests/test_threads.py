"""Rank 0's threads: what they share is safe to share, and what they start never holds up a
report. These call the pieces in-process; the runs that use them are in test_validation.py,
test_async.py and the kill harness."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import HERE, python

import hpckit
from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, settings
from hpckit.config.callbacks import TrainRunContext, UserCallback
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import VALIDATED, Validation
from hpckit.errors import ExperimentClosedError
from hpckit.experiment.writer import Writer
from hpckit.run.commit.coordinator import Callbacks
from hpckit.run.commit.coordinator import Coordinator
from hpckit.storage.location import resolve


class Counted(UserCallback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def after_report(self, run_context, metrics, checkpoint) -> None:
        self.steps.append(metrics[0]["step"])


def lost_calls(reports: int) -> int:
    """The commit thread notes ``reports`` reports while the main thread takes the due calls,
    threads switching every microsecond; the after_report calls lost or out of order."""
    counted = Counted()
    callbacks = Callbacks([counted], TrainRunContext(run_config=None))

    def commit_thread() -> None:
        for step in range(reports):
            callbacks.heard(step, [{"step": step}])
            callbacks.recorded(step, None)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        noting = threading.Thread(target=commit_thread)
        noting.start()
        while noting.is_alive():
            callbacks.call_due()
        noting.join()
    finally:
        sys.setswitchinterval(interval)
    callbacks.call_due()
    return 0 if counted.steps == list(range(reports)) else reports - len(counted.steps) or 1


@pytest.mark.quick
def test_after_report_is_called_once_for_every_report_noted_while_the_calls_are_taken():
    """A report noted between taking the due list and emptying it would be lost: planted
    (``due = list(self._due); self._due.clear()``), one round in three found no loss, so
    five rounds are run: the planted race failed five runs of five."""
    for round_ in range(5):
        lost = lost_calls(60_000)
        assert lost == 0, f"round {round_}: {lost} after_report call(s) lost or out of order"


VALIDATING = HERE / "ranks" / "validating.py"
SBATCH_DELAY_S = 8.0
# `sbatch --wait --parsable` that answers its first submission after SBATCH_DELAY_S, as a loaded
# slurmctld may, the later ones at once; it runs the job here and ends with it.
FAKE_SBATCH = """#!/bin/bash
out=/dev/null; wrap=
for a in "$@"; do case "$a" in --output=*) out="${{a#--output=}}";; esac; done
while [ $# -gt 0 ]; do [ "$1" = --wrap ] && wrap="$2"; shift; done
mkdir "$0.answered" 2>/dev/null && sleep {delay:g}
echo 4242
bash -c "$wrap" > "$out" 2>&1
"""


def outcomes(experiment: Path) -> dict[str, str | None]:
    written = json.loads((experiment / "manifest.json").read_text())
    return {r["directory"]: (r.get("validation") or {}).get("status")
            for r in written["checkpoints"]}


def test_a_validation_submitted_to_a_slow_sbatch_does_not_hold_up_the_reports(tmp_path):
    """The first two checkpoints ask for validation as Slurm jobs, and sbatch answers after
    8 s: the reports after them return at once (the second report waited 8 s for the
    first validation's start before). Not alone: a report takes milliseconds, against the
    8 s it would wait."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(delay=SBATCH_DELAY_S))
    (bin_dir / "sbatch").chmod(0o755)
    done = python("--storage", str(tmp_path), "--case", "slow-sbatch", script=VALIDATING,
                  timeout=120, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    seconds = json.loads(done.line("SECONDS") or "null")
    assert seconds and max(seconds) < SBATCH_DELAY_S / 4, done.output
    kept = outcomes(tmp_path / "e")
    assert [kept[f"checkpoint_00000{i}"] for i in range(4)] == ["VALIDATED"] * 2 + [None] * 2


def test_a_validation_that_cannot_be_recorded_fails_the_next_step(tmp_path):
    failed = python("--storage", str(tmp_path), "--case", "unrecorded", script=VALIDATING,
                    timeout=120, expect=None)
    assert failed.returncode != 0, failed.output
    assert "CommitError" in failed.output and "checkpoint_000000" in failed.output, failed.output
    assert "could not be started or its outcome recorded" in failed.output, failed.output
    assert int(failed.line("REPORTS") or 600) < 600, "the run went on to its end"


def test_a_report_after_a_caught_validation_error_hands_the_same_files_as_the_failed_one(
        tmp_path):
    """#54: the report that tells a validation's failure fails before rank 0 reads the files
    each rank announced; a rank that announced a new list there and hands the same again
    sends only its digest. Rank 0 keeps every announced list before any check, so the
    training loop that caught the CommitError goes on committing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)  # rank 0's training function makes it unrunnable
    done = python("--storage", str(tmp_path), "--case", "caught", script=VALIDATING,
                  timeout=120, env={"PATH": str(bin_dir)})
    caught = [line for line in done.output.splitlines() if line.startswith("CAUGHT ")]
    assert len(caught) == 1 and "could not be started" in caught[0], done.output
    assert done.line("COMMITTED") == "3", done.output
    kept = json.loads((tmp_path / "e" / "manifest.json").read_text())["checkpoints"]
    files = {r["directory"]: sorted(f["path"] for f in r["files"]) for r in kept}
    assert files["checkpoint_000002"] == ["later-rank0", "later-rank1"], files


def test_a_validation_running_when_its_attempt_fails_is_done_once_by_the_retry(tmp_path):
    """The first attempt fails with checkpoint_000000's validation running: it is stopped,
    and nothing of that attempt is written afterwards; the in-process retry validates it
    (once) and the manifest keeps both attempts, which a late write of the first attempt's
    manifest would have replaced."""
    log = tmp_path / "validations.log"
    python("--storage", str(tmp_path), "--case", "fails-once", "--log", str(log),
           script=VALIDATING, timeout=120)
    written = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert [(a["attempt"], a["status"]) for a in written["attempts"]] == [
        (0, "failed"), (1, "finished")], written["attempts"]
    assert outcomes(tmp_path / "e") == {"checkpoint_000000": "VALIDATED",
                                        "checkpoint_000001": "VALIDATED"}
    started = [line.split() for line in log.read_text().splitlines()]
    assert [name for name, _ in started] == ["checkpoint_000000"] * 2 + ["checkpoint_000001"]
    assert started[0][1] != started[1][1], "the first attempt's validation was not stopped"


def four_checkpoints(config: dict) -> None:
    for step in range(4):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d))


@pytest.mark.quick
def test_a_closed_experiment_refuses_every_write(tmp_path):
    """What keeps a validation thread that outlived its attempt from writing: once closed,
    the experiment refuses the manifest and the checkpoint directories."""
    DataParallelTrainer(four_checkpoints,
                        run_config=RunConfig(name="e", storage_path=str(tmp_path))).fit()
    location = resolve(str(tmp_path / "e"))
    experiment = Experiment.for_maintenance(location, settings.current(), force=False)
    experiment.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "e").iterdir() if p.is_file()}
    newest = experiment.manifest.latest.directory
    done = Validation.asked({"fn_kwargs": {}, "timeout_s": None}).ended(VALIDATED, {"v": 1})
    with pytest.raises(ExperimentClosedError):
        experiment.record_validation(newest, done, CheckpointConfig())
    with pytest.raises(ExperimentClosedError):
        experiment.discard(newest)
    with pytest.raises(ExperimentClosedError):
        experiment.end_attempt(AttemptStatus.FAILED, "late")
    after = {p.name: p.read_bytes() for p in (tmp_path / "e").iterdir() if p.is_file()}
    assert after == before
    assert (tmp_path / "e" / newest).is_dir()


def test_a_run_leaves_no_background_thread_behind(tmp_path):
    """Each background worker of a run ends with it: a process that runs many (a sweep's
    trials, in-process retries) does not gather idle threads, one per run."""
    before = {t.ident for t in threading.enumerate()}
    DataParallelTrainer(four_checkpoints, run_config=RunConfig(
        name="e", storage_path=str(tmp_path),
        checkpoint_config=CheckpointConfig(num_to_keep=1))).fit()  # evictions: the purge ran
    left = [t.name for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("hpckit-")]
    assert left == [], left


def test_a_metrics_only_report_hands_its_line_over_and_returns():
    """On object storage a metrics line rewrites metrics.jsonl, a PUT that a loaded endpoint
    may take seconds over, and every rank waited for it: now the line goes to the writer and
    the report returns; the lines are written in report order, and a write that fails is
    what the next collective step finds (before, the report waited for the write)."""
    release = threading.Event()
    lines: list[int] = []

    class SlowExperiment:
        writer = Writer("slow")

        def log_report(self, step: int, metrics: dict) -> None:
            release.wait(10)
            if metrics.get("fail"):
                raise OSError(5, "Input/output error")
            lines.append(step)

    coordinator = Coordinator(SlowExperiment(), CheckpointConfig())  # type: ignore[arg-type]
    try:
        coordinator.log(0, {"loss": 1.0})
        coordinator.log(1, {"loss": 0.5})
        coordinator.log(2, {"fail": True})
        assert lines == [], "a report waited for its metrics line"
        release.set()
        coordinator.committer.wait()
        assert lines == [0, 1]
        assert isinstance(coordinator.committer.newly_committed()[1], OSError)
    finally:
        release.set()
        SlowExperiment.writer.close()
