"""Two tests at a time, except where a test must have the machine to itself.

The suite runs on pytest-xdist's workers (setup.cfg: ``-n 2``): most tests
wait for processes, Slurm or the S3 server much of their time, and a second worker fills the
idle core. A test marked ``alone`` runs with no other test beside it: one that asserts a
duration, loads both cores itself (``cpu_burner``), or compares machine-wide state such as
/dev/shm before and after. Every test holds a shared lock on one file of the run while it
runs (setup and teardown included); an ``alone`` test holds it exclusively, so it starts once
the other worker's test has ended, and the other worker waits until it ends.

A test marked ``waiting`` mostly waits (Slurm's grace time, a stale lock, a stalled server)
and times or counts what it waits for: a busy test beside it would distort that, another
``waiting`` test does not (two of them use less than one core; measured 2026-11-27: 0.03 to
0.5 of a core each). They run last, two at a time, behind the ``alone`` tests: those take
the lock exclusively, so the busy tests have all ended before the first ``waiting`` one
starts.

The tests are handed out from one queue two at a time (``--dist load --maxschedchunk 2``),
longest first by the durations a recorded run left in tests/durations.json (``pytest
--record-durations`` writes it): a long test started last would hold one worker while the
other has nothing left, and an ``alone`` test taken early would wait for whatever the other
worker runs. Tests the file does not know keep their place after the ones it does.

The fault-injection figures (tests/support/reliability.py) are gathered on the workers; each worker
hands its trials to the controller, which prints the summary.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import reliability
TRIALS_KEY = "hpckit_reliability_trials"
# Read now, as conftest is imported: a session fixture gives each worker a TMPDIR of its own.
SHARED_DIR = tempfile.gettempdir()
DURATIONS = Path(__file__).parent.parent / "durations.json"
RECORDED_FROM_S = 0.5  # shorter tests keep their place: their order changes nothing
MEASURED: Counter[str] = Counter()  # on the controller: seconds per test, setup to teardown


def _lock_path(config: pytest.Config) -> str | None:
    """The run's lock file, shared by its workers; None outside xdist (one test at a time)."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return None
    return os.path.join(SHARED_DIR, f"hpckit-tests-{worker['testrunuid']}.lock")


@contextlib.contextmanager
def _turn(item: pytest.Item) -> Iterator[None]:
    path = _lock_path(item.config)
    if path is None:
        yield
        return
    with open(path, "a") as lock:
        alone = item.get_closest_marker("alone") is not None
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test's duration to {DURATIONS.name}, which orders the "
                          "tests of later runs (longest first)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``alone`` tests after the rest, and the ``waiting`` ones last: each ``alone`` test
    waits for the other worker's test to end and holds the other worker up while it runs, so
    they run one after another, while the rest run two at a time before them and the
    ``waiting`` ones two at a time after them, longest first in each part."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: (_part(item), -known.get(item.nodeid, 0.0)))


def _part(item: pytest.Item) -> int:
    if item.get_closest_marker("waiting") is not None:
        return 2
    return 1 if item.get_closest_marker("alone") is not None else 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _turn(item):
        yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    MEASURED[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a worker: its fault-injection trials, for the controller's summary. On the
    controller, with ``--record-durations``: the durations that order the next runs."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[TRIALS_KEY] = json.dumps(reliability.TRIALS)
    elif session.config.getoption("record_durations"):
        durations = {test: round(seconds, 1) for test, seconds in sorted(MEASURED.items())
                     if seconds >= RECORDED_FROM_S}
        DURATIONS.write_text(json.dumps(durations, indent=0) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    """On the controller: a worker's trials join the summary."""
    trials = getattr(node, "workeroutput", {}).get(TRIALS_KEY)
    if trials:
        reliability.TRIALS.extend(json.loads(trials))
