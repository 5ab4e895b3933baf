"""Fuzzed directories that several ranks hand at once (#65), on real ranks: each example is
a folder of files on the shared filesystem (some read-only, some in read-only subfolders),
written by rank 0 and handed to report() by every rank, in each upload mode, with a failure
injected on one rank at one of the hand-over's renames or copies, or at the commit. After
each example no file is gone from the folder that the committed checkpoint does not hold;
where the report succeeded, the checkpoint holds every file, and the folder went only with
it. Both ranks draw the same examples (fixed seed) and agree on each example's outcome
before the next, so a failed check ends both.

    mpiexec -n 2 python shared_trees.py ROOT SEED EXAMPLES

Prints ``SHARED {json}`` (how many examples, commits, injected failures met) on rank 0.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from mpi4py import MPI

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from hpckit.errors import HpckitError, StorageError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.reading import read_manifest
from hpckit.run.writing import staging
from hpckit.storage.location import resolve

WORLD = MPI.COMM_WORLD
COUNTS: collections.Counter[str] = collections.Counter()


@dataclass(frozen=True)
class Example:
    files: tuple[tuple[str, bytes, bool], ...]  # name, content, read-only
    read_only_folder: bool  # sub/ is 0555 once written
    mode: str
    delete_local: bool | None
    fault_rank: int
    fault_at: str  # hand-over, commit, none
    occurrence: int
    error: int


NAMES = st.sampled_from(("model.pt", "optim.pt", "sub/a.bin", "sub/b.bin", "meta.json",
                         "model-rank=0.pt", "model-rank=1.pt"))
EXAMPLES = st.builds(
    Example,
    st.lists(st.tuples(NAMES, st.binary(max_size=32), st.booleans()), min_size=1, max_size=5,
             unique_by=lambda f: f[0]).map(tuple),
    st.booleans(), st.sampled_from(("sync", "async", "async")),
    st.sampled_from((None, True, False)), st.integers(0, 1),
    st.sampled_from(("hand-over", "hand-over", "commit", "none")), st.integers(1, 3),
    st.sampled_from((errno.EACCES, errno.ENOSPC, errno.EXDEV)))


def hands_the_folder(config: dict) -> None:
    hpckit.report({"n": 0}, Checkpoint.from_directory(config["folder"]),
                  checkpoint_upload_mode=config["mode"],
                  delete_local_checkpoint_after_upload=config["delete_local"])


def inject(example: Example) -> Any:
    """Arm the example's failure on this rank; returns what undoes it."""
    calls: collections.Counter[str] = collections.Counter()
    saved = staging._rename, staging._copy, Experiment.commit

    def failing(at: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[at] += 1
            if at == example.fault_at and calls[at] == example.occurrence:
                COUNTS[f"fault at {at}"] += 1
                if at == "commit":
                    raise StorageError(f"injected: {os.strerror(example.error)}")
                raise OSError(example.error, os.strerror(example.error))
            return real(*args, **kwargs)
        return call

    if WORLD.rank == example.fault_rank:
        staging._rename = failing("hand-over", staging._rename)
        staging._copy = failing("hand-over", staging._copy)
        Experiment.commit = failing("commit", Experiment.commit)  # type: ignore[method-assign]

    def undo() -> None:
        staging._rename, staging._copy, Experiment.commit = saved  # type: ignore[method-assign]
    return undo


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def check(example: Example, folder: Path, storage: Path, before: dict[str, str],
          failed: bool) -> None:
    """On rank 0: what is gone from the folder is committed; a success committed it all."""
    manifest = read_manifest(resolve(str(storage / "exp")))
    committed: set[str] = set()
    names: dict[str, str] = {}
    for record in manifest.checkpoints if manifest else ():
        names = digests(storage / "exp" / record.directory)
        committed |= set(names.values())
    after = digests(folder) if folder.exists() else {}
    lost = {name for name in before.keys() - after.keys() if before[name] not in committed}
    assert not lost, f"{example}: files gone that no committed checkpoint holds: {lost}"
    changed = {name for name in before.keys() & after.keys() if before[name] != after[name]}
    assert not changed, f"{example}: files changed: {changed}"
    if not failed:
        COUNTS["committed"] += 1
        held = {k: v for k, v in names.items() if not k.startswith(".hpckit")}
        assert held == before, f"{example}: the checkpoint holds {held}, not {before}"


def one(example: Example, root: Path) -> None:
    where = tempfile.mkdtemp(dir=root) if WORLD.rank == 0 else None
    base = Path(WORLD.bcast(where, root=0))
    folder, storage = base / "handed", base / "storage"
    if WORLD.rank == 0:
        for name, content, read_only in example.files:
            (folder / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(content)
            if read_only:
                os.chmod(folder / name, 0o444)
        if example.read_only_folder and (folder / "sub").is_dir():
            os.chmod(folder / "sub", 0o555)
    before = digests(folder) if WORLD.rank == 0 else {}
    WORLD.Barrier()
    undo = inject(example)
    ended = "returned"
    try:
        DataParallelTrainer(hands_the_folder, train_loop_config={
            "folder": str(folder), "mode": example.mode, "delete_local": example.delete_local},
            scaling_config=ScalingConfig(num_workers=WORLD.size),
            run_config=RunConfig(name="exp", storage_path=str(storage))).fit()
    except HpckitError:
        ended = "raised"
    except Exception as exc:
        ended = f"raised {exc!r}, which is no HpckitError"
    finally:
        undo()
    # Rank 0 looks once every rank's fit() has returned: a rank's fit() may return while
    # another still ends its attempt (its staging, under base, removed; handed files removed).
    endings = WORLD.allgather(ended)
    problem = None
    if WORLD.rank == 0:
        try:
            if len(set(endings)) > 1 or endings[0] not in ("returned", "raised"):
                raise AssertionError(f"{example}: the ranks' fit() ended so: {endings}")
            check(example, folder, storage, before, ended != "returned")
        except AssertionError as exc:
            problem = str(exc)
        except Exception as exc:  # any other: both ranks must still leave this example alike
            problem = f"{example}: checking raised {exc!r}"
        try:
            for parent, dirs, _ in os.walk(base):
                for name in dirs:
                    os.chmod(os.path.join(parent, name), 0o755)
            shutil.rmtree(base)
        except OSError as exc:
            problem = problem or f"{example}: removing {base} raised {exc!r}"
    problem = WORLD.bcast(problem, root=0)
    COUNTS["examples"] += 1
    if problem is not None:
        raise AssertionError(problem)


def main() -> None:
    root, chunk, examples = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

    @seed(chunk)
    @settings(max_examples=examples, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(example=EXAMPLES)
    def shared_tree(example: Example) -> None:
        one(example, root)

    shared_tree()
    every = WORLD.gather(dict(COUNTS), root=0)
    if WORLD.rank == 0:
        total = collections.Counter(every[0])
        total.update({k: v for k, v in every[1].items() if k.startswith("fault")})
        print(f"SHARED {json.dumps(dict(total))}", flush=True)


if __name__ == "__main__":
    main()
