"""Rank 0's threads: what they share is safe to share, and what they start never holds up a
report. These call the pieces in-process; the runs that use them are in test_validation.py,
test_async.py and the kill harness."""

from __future__ import annotations

import sys
import threading

import pytest

from hpckit.config.callbacks import TrainRunContext, UserCallback
from hpckit.run.commit.callbacks import Callbacks


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
