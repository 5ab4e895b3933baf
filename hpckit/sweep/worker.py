"""Entry point of a rank of a sweep that ``python sweep.py`` started
(``python -m hpckit.sweep.worker``; see :mod:`hpckit.sweep.spawned`). Nothing imports it."""

from __future__ import annotations

import os
import pickle

from hpckit import settings as _settings
from hpckit.errors import LaunchError
from hpckit.launch.mainimport import enter
from hpckit.sweep.spawned import TUNER


def main() -> None:
    current = _settings.refresh()
    if not current.sweep_payload:
        raise LaunchError("hpckit.sweep.worker is started by Tuner.fit(), not by hand")
    enter(current.sweep_payload)
    with open(os.path.join(current.sweep_payload, TUNER), "rb") as f:
        tuner = pickle.load(f)
    tuner.fit()


if __name__ == "__main__":
    main()
