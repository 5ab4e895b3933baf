"""Entry point of a rank started by hpckit itself: ``python -m hpckit._worker``."""

from __future__ import annotations

import json
import os
import pickle
import sys

from hpckit import _launch
from hpckit._env import Environment


def main() -> None:
    env = Environment.read()
    assert env.worker, "hpckit._worker is started by a trainer's fit(), not by hand"
    with open(os.path.join(env.worker, "main.json")) as f:
        spec = json.load(f)
    sys.path[:] = spec["sys_path"]
    sys.argv[:] = spec["argv"]
    os.chdir(spec["cwd"])
    _launch.import_main(spec["main"])
    with open(os.path.join(env.worker, "trainer.pkl"), "rb") as f:
        trainer = pickle.load(f)
    trainer._run_ranks(env)


if __name__ == "__main__":
    main()
