"""Under load: 4 ranks, 400 reports with checkpoints and top-K retention. The experiment never
holds more than K+1 checkpoint directories, no descriptors or temp directories leak, and
memory does not grow with the number of reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest
from support import reliability
from conftest import HERE, MPIEXEC, Run, manifest

# It measures memory growth and descriptors of four ranks over 400 reports.
pytestmark = pytest.mark.alone

SOAK = HERE / "ranks" / "soak.py"
# Growth is measured over the last 300 reports: what the first hundred import and allocate
# once (about 180 KiB more since the validation and upload code) is not growth per report.
# Measured 2026-11-26: rank 0 grows 2.2 KiB a report in the long run, as before that code.
RANKS, REPORTS, KEEP, WARMUP = 4, 400, 3, 100
GROWTH_PER_REPORT_KIB = 4.0  # allows the one metrics line per report that rank 0 keeps


@pytest.mark.timeout(240)
def test_four_ranks_four_hundred_reports_stay_bounded(tmp_path):
    storage, scratch = tmp_path / "storage", tmp_path / "tmp"
    scratch.mkdir()
    experiment = storage / "soak"
    most, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if experiment.is_dir():
                count = sum(1 for p in os.scandir(experiment) if p.name.startswith("checkpoint_"))
                most[0] = max(most[0], count)
            stop.wait(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    command = [MPIEXEC, "-prepend-rank", "-n", str(RANKS), sys.executable, str(SOAK), "--storage",
               str(storage), "--reports", str(REPORTS), "--keep", str(KEEP), "--warmup", str(WARMUP)]
    env = {**os.environ, "TMPDIR": str(scratch), "HPCKIT_LOCAL_DIR": str(scratch),
           "HPCKIT_LOG_LEVEL": "WARNING"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=200, env=env)
    finally:
        stop.set()
        watcher.join()
    run = Run(done.returncode, done.stdout + done.stderr)
    assert run.returncode == 0, run.output
    ranks = [json.loads(m) for m in re.findall(r"SOAK (\{[^}]*\})", run.output)]
    assert sorted(r["rank"] for r in ranks) == list(range(RANKS)), run.output

    assert 1 <= most[0] <= KEEP + 1, f"{most[0]} checkpoint directories at once (K={KEEP})"
    kept = [c["directory"] for c in manifest(experiment)["checkpoints"]]
    assert len(kept) == KEEP and sorted(p.name for p in experiment.glob("checkpoint_*")) == kept
    assert manifest(experiment)["next_checkpoint_index"] == REPORTS
    for r in ranks:
        assert r["fds_end"] == r["fds_early"], f"rank {r['rank']} leaked descriptors: {r}"
        growth = (r["rss_end_kib"] - r["rss_early_kib"]) / (REPORTS - WARMUP)
        assert growth <= GROWTH_PER_REPORT_KIB, f"rank {r['rank']} grows {growth:.1f} KiB/report"
    assert os.listdir(scratch) == [], f"temporary files left behind: {os.listdir(scratch)}"
    growth = max(r["rss_end_kib"] - r["rss_early_kib"] for r in ranks)
    end = reliability.check_experiment(experiment, reliability.reported(experiment))
    reliability.record("soak", f"{RANKS} ranks x {REPORTS} reports, K={KEEP}",
                       f"at most {most[0]} checkpoint dirs, descriptors unchanged, no temp files, "
                       f"RSS +{growth} KiB over {REPORTS - WARMUP} reports (worst rank)",
                       lost=len(end.lost))
    assert not end.lost, f"the {KEEP} best checkpoints were not all kept: {end.lost} are missing"
