"""Entry point of a validation process that rank 0 starts:
``python -m hpckit.launch.validator PAYLOAD WORK``. It imports the user's script as a rank
does (stopping at its ``fit()``), calls the validation function on the checkpoint, and
answers in WORK: ``result.json`` (the metrics) or ``error.txt`` (why it failed)."""

from __future__ import annotations

import json
import os
import pickle
import sys
import traceback

from hpckit.experiment.values import to_json_metrics
from hpckit.launch.mainimport import enter
from hpckit.run.validation.child import ERROR, FN, RESULT, TASK


def main(payload: str, work: str) -> int:
    try:
        enter(payload)
        with open(os.path.join(payload, FN), "rb") as f:
            fn = pickle.load(f)
        with open(os.path.join(work, TASK), "rb") as f:
            checkpoint, kwargs = pickle.load(f)
        metrics = fn(checkpoint, **kwargs)
        if not isinstance(metrics, dict):
            raise TypeError(f"the validation function returned {type(metrics).__name__}; it "
                            "must return a dict of metrics")
        _answer(work, RESULT, json.dumps(to_json_metrics(metrics)))
        return 0
    except BaseException as exc:  # noqa: BLE001  (every failure is answered, then exits 1)
        traceback.print_exc()
        _answer(work, ERROR, f"{type(exc).__name__}: {exc}")
        return 1


def _answer(work: str, name: str, text: str) -> None:
    """Whole or not at all: rank 0 may read it the moment it appears."""
    with open(os.path.join(work, f".{name}.tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(work, f".{name}.tmp"), os.path.join(work, name))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
