"""Two tests at a time, except where a test must have the machine to itself.

The suite runs on pytest-xdist's workers (setup.cfg: ``-n 2 --dist worksteal``): most tests
wait for processes, Slurm or the S3 server much of their time, and a second worker fills the
idle core. A test marked ``alone`` runs with no other test beside it: one that asserts a
duration, loads both cores itself (``cpu_burner``), or compares machine-wide state such as
/dev/shm before and after. Every test holds a shared lock on one file of the run while it
runs (setup and teardown included); an ``alone`` test holds it exclusively, so it starts once
the other worker's test has ended, and the other worker waits until it ends.

The fault-injection figures (tests/reliability.py) are gathered on the workers; each worker
hands its trials to the controller, which prints the summary.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator

import pytest
import reliability

TRIALS_KEY = "hpckit_reliability_trials"
# Read now, as conftest is imported: a session fixture gives each worker a TMPDIR of its own.
SHARED_DIR = tempfile.gettempdir()


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``alone`` tests last: each waits for the other worker's test to end and holds the
    other worker up while it runs, so they run one after another at the end, while the rest
    run two at a time before them."""
    items.sort(key=lambda item: item.get_closest_marker("alone") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _turn(item):
        yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a worker: its fault-injection trials, for the controller's summary."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[TRIALS_KEY] = json.dumps(reliability.TRIALS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    """On the controller: a worker's trials join the summary."""
    trials = getattr(node, "workeroutput", {}).get(TRIALS_KEY)
    if trials:
        reliability.TRIALS.extend(json.loads(trials))
