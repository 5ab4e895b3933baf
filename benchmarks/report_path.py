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
counts meet that (``meets``). It also asks that ``report()``'s ``checkpoint``, followed
through the calls that pass it on, climb back to a higher layer at most twice: each line
lists those calls (``followed``: every call of hpckit that received the reported
``Checkpoint`` object itself as an argument, ``self`` included), counts them (``stops``) and
their modules, the climbs (``climbed``: a call from a module up into one of a higher layer
or, within ``hpckit.run``, a higher room, by the import-linter contracts of pyproject.toml)
and the returns to a module the checkpoint had left. The reported ``Checkpoint`` is made
before the profile starts: making it is the user's line, not the report.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import tomllib
from pathlib import Path
from typing import Any

import hpckit
from hpckit import Checkpoint, CheckpointUploadMode, DataParallelTrainer, RunConfig, ScalingConfig

GOAL_MODULES, GOAL_PACKAGES = 8, 3
GROUND = {"hpckit.settings", "hpckit.faults", "hpckit.background",
          "hpckit.logs", "hpckit.writes", "hpckit.errors", "hpckit.variables", "hpckit.exits"}


def package_of(module: str) -> str:
    return module.rsplit(".", 1)[0] if module.count(".") > 1 else module


def _layers() -> tuple[list[list[str]], list[list[str]]]:
    """The import-linter contracts' layers, highest first: hpckit's, and its run's rooms."""
    contracts = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    found = {tuple(c.get("containers", ())): c["layers"]
             for c in contracts["tool"]["importlinter"]["contracts"] if c["type"] == "layers"}

    def split(layers: list[str]) -> list[list[str]]:
        return [[name.strip() for name in layer.split("|")] for layer in layers]

    return split(found[()]), split(found[("hpckit.run",)])


TOP, ROOMS = _layers()


def layer_of(module: str) -> tuple[int, int]:
    """Where ``module`` stands in the contracts, smaller being higher: its layer of hpckit,
    then its room of hpckit.run (``hpckit`` itself, the public API, stands above them all)."""
    def index(layers: list[list[str]], name: str) -> int | None:
        return next((i for i, names in enumerate(layers)
                     if any(name == n or name.startswith(n + ".") for n in names)), None)

    top = index(TOP, module)
    if top is None:
        return (-1, 0)
    room = index(ROOMS, module.removeprefix("hpckit.run.")) if module.startswith("hpckit.run.") else 0
    return (top, room or 0)


def profiled(mode: CheckpointUploadMode) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The hpckit modules the third report in ``mode`` entered, first entry first; and the
    calls that passed that report's ``Checkpoint`` on (the object itself an argument, ``self``
    included), each as (calling module, called module, called function), in order."""
    entered: dict[str, None] = {}
    passed: list[tuple[str, str, str]] = []
    handed: list[Checkpoint] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_globals.get("__name__", "")
        if event == "call" and name.startswith("hpckit"):
            entered.setdefault(name, None)
            if handed and any(value is handed[0] for value in frame.f_locals.values()):
                caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
                passed.append((caller, name, frame.f_code.co_name))

    def train(config: dict) -> None:
        for step in range(3):
            directory = tempfile.mkdtemp()
            with open(os.path.join(directory, "model.pt"), "wb") as f:
                f.write(os.urandom(1024))
            checkpoint = Checkpoint.from_directory(directory)
            if step == 2:
                handed.append(checkpoint)
                threading.setprofile(profile)
                sys.setprofile(profile)
            hpckit.report({"loss": 1.0 / (step + 1)}, checkpoint=checkpoint,
                          checkpoint_upload_mode=mode)
            if step == 2:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]

    DataParallelTrainer(train, scaling_config=ScalingConfig(num_workers=1),
                        run_config=RunConfig(name=f"path-{mode.name.lower()}",
                                             storage_path=tempfile.mkdtemp())).fit()
    return list(entered), passed


def followed(passed: list[tuple[str, str, str]]) -> dict[str, Any]:
    """The checkpoint's journey: its stops (calls in hpckit that received it), the modules
    they lie in, the climbs (a call from a lower layer up into a higher one: only a callback or
    a method of an object handed down makes one) and the returns to a module already left."""
    stops = [(caller, called, function) for caller, called, function in passed]
    climbs = [f"{caller} -> {called}.{function}" for caller, called, function in stops
              if caller.startswith("hpckit") and layer_of(called) < layer_of(caller)]
    sequence = [called for _, called, _ in stops]
    returns = sum(1 for i, module in enumerate(sequence)
                  if i and module != sequence[i - 1] and module in sequence[:i - 1])
    return {"stops": len(stops), "stop_modules": len(dict.fromkeys(sequence)),
            "climbs": len(climbs), "returns": returns, "climbed": climbs,
            "followed": [f"{called}.{function}" for _, called, function in stops]}


def main() -> None:
    for mode in (CheckpointUploadMode.ASYNC, CheckpointUploadMode.SYNC):
        modules, passed = profiled(mode)
        packages = {package_of(m) for m in modules}
        inner = [m for m in modules if m not in GROUND and not m.startswith("hpckit.storage")]
        print(json.dumps({
            "benchmark": "report_path", "mode": mode.name, "modules": len(modules),
            "packages": len(packages), "modules_above_ground_and_storage": len(inner),
            "packages_above_ground_and_storage": len({package_of(m) for m in inner}),
            "goal_modules": GOAL_MODULES, "goal_packages": GOAL_PACKAGES,
            "meets": len(modules) <= GOAL_MODULES and len(packages) <= GOAL_PACKAGES,
            "path": modules, **followed(passed)}))


if __name__ == "__main__":
    main()
