"""``python tests/ranks/failing_fits.py STORAGE N``: N in-process fit()s whose training function
raises, each caught, as a notebook or a script trying configurations would; prints ``DONE N``
once all N returned their error (MPI allows a process a few thousand communicators)."""

from __future__ import annotations

import sys

from hpckit import DataParallelTrainer, RunConfig, TrainingFailedError


def fails(config: dict) -> None:
    raise ValueError("this configuration does not train")


def main() -> None:
    storage, count = sys.argv[1], int(sys.argv[2])
    for index in range(count):
        try:
            DataParallelTrainer(fails, run_config=RunConfig(name=f"try-{index}",
                                                            storage_path=storage)).fit()
        except TrainingFailedError:
            continue
        raise AssertionError(f"fit() {index} did not fail")
    print(f"DONE {count}", flush=True)


if __name__ == "__main__":
    main()
