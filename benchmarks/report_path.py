"""The modules and packages one ``report()`` with a checkpoint passes through, counted (#68).

    python benchmarks/report_path.py

One rank, in this process: a training function reports a 1 KiB checkpoint three times; the
third report is profiled (``sys.setprofile`` and ``threading.setprofile``, so the background
threads a report starts count too) from the call until it returns, and every function of
hpckit called in that time names its module. An ASYNC and a SYNC report each make one JSON
line: the modules in the order they were first entered, how many there are, how many
packages they lie in (a module directly in ``hpckit`` is its own), and the same counts
without the ground layer and ``storage`` (what every layer may use: logs, settings, faults,
the files themselves). The background work an ASYNC report hands over ends after it
returns; its commit, made at the next report, is not counted here.

#68 asks for at most 8 modules in at most 3 packages per report; the lines say whether the
counts meet that (``meets``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from typing import Any

import hpckit
from hpckit import Checkpoint, CheckpointUploadMode, DataParallelTrainer, RunConfig, ScalingConfig

GOAL_MODULES, GOAL_PACKAGES = 8, 3
GROUND = {"hpckit.settings", "hpckit.faults", "hpckit.background",
          "hpckit.logs", "hpckit.writes", "hpckit.errors", "hpckit.variables", "hpckit.exits"}


def package_of(module: str) -> str:
    return module.rsplit(".", 1)[0] if module.count(".") > 1 else module


def profiled(mode: CheckpointUploadMode) -> list[str]:
    """The hpckit modules the third report in ``mode`` entered, first entry first."""
    entered: dict[str, None] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_globals.get("__name__", "")
        if event == "call" and name.startswith("hpckit"):
            entered.setdefault(name, None)

    def train(config: dict) -> None:
        for step in range(3):
            directory = tempfile.mkdtemp()
            with open(os.path.join(directory, "model.pt"), "wb") as f:
                f.write(os.urandom(1024))
            if step == 2:
                threading.setprofile(profile)
                sys.setprofile(profile)
            hpckit.report({"loss": 1.0 / (step + 1)}, checkpoint=Checkpoint.from_directory(directory),
                          checkpoint_upload_mode=mode)
            if step == 2:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]

    DataParallelTrainer(train, scaling_config=ScalingConfig(num_workers=1),
                        run_config=RunConfig(name=f"path-{mode.name.lower()}",
                                             storage_path=tempfile.mkdtemp())).fit()
    return list(entered)


def main() -> None:
    for mode in (CheckpointUploadMode.ASYNC, CheckpointUploadMode.SYNC):
        modules = profiled(mode)
        packages = {package_of(m) for m in modules}
        inner = [m for m in modules if m not in GROUND and not m.startswith("hpckit.storage")]
        print(json.dumps({
            "benchmark": "report_path", "mode": mode.name, "modules": len(modules),
            "packages": len(packages), "modules_above_ground_and_storage": len(inner),
            "packages_above_ground_and_storage": len({package_of(m) for m in inner}),
            "goal_modules": GOAL_MODULES, "goal_packages": GOAL_PACKAGES,
            "meets": len(modules) <= GOAL_MODULES and len(packages) <= GOAL_PACKAGES,
            "path": modules}))


if __name__ == "__main__":
    main()
