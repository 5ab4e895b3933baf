"""Fuzzed file trees against the whole surface (#51): hypothesis builds a tree (regular files,
empty directories, symbolic links to files and directories inside and outside it, hard links,
names with spaces, unicode and bytes that are not UTF-8, a nested experiment, links to the
storage root and the working directory) in one of several places (on its own, inside another
experiment, in the storage root, as the storage root, inside the experiment, behind a link),
and drives report() (sync, ASYNC, checkpoint_upload_fn, save_state, checkpoint_dir_name),
Checkpoint.as_directory/to_directory/update_metadata, ``hpckit export``, ``gc``, ``verify`` and
a resume on it. After each step no byte outside the experiment's own directory changed but
what the ownership rule lets report() take (hpckit/experiment/ownership.py), and every
committed checkpoint of every experiment in reach still verifies. A refusal is an
:class:`HpckitError`, never another exception.

Each first run meets an injected failure (#65): a rename or a copy of the hand-over, or
a commit, fails; every file gone from the tree must then be in a committed checkpoint.
Trees hold read-only files and folders, and the fuzzing processes run without the
capabilities that let root ignore them. The suite runs ``FUZZED_TREES`` trees (300), 300
to a process with fixed seeds 0, 1, ...; a release runs more: ``FUZZED_TREES=6000 pytest
tests/test_fuzzed_trees.py -n0`` (20 processes). A failure prints the tree as drawn; to shrink it, run one
process by hand: ``FUZZED_TREES_SHRINK=1 python tests/test_fuzzed_trees.py DIR SEED 200``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import run
from hypothesis import HealthCheck, Phase, event, given, seed, settings
from hypothesis import strategies as st

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig
from hpckit.cli import main
from hpckit.errors import (
    CheckpointError,
    ControllerError,
    HpckitError,
    StorageError,
    WorkerGroupError,
)
from hpckit.experiment.manifest import MANIFEST_NAME
from hpckit.experiment.reading import read_manifest
from hpckit.storage.location import resolve

EXAMPLES = int(os.environ.get("FUZZED_TREES", "300"))
PER_PROCESS = 300
# The fuzzing processes run as root without the capabilities that let root ignore
# permissions, so that a tree's read-only files and folders are read-only to hpckit too.
AS_A_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
OUTCOMES: dict[str, Any] = {"trees": 0, "committed": 0, "refused": collections.Counter(),
                            "faults": collections.Counter()}
MANIFEST = MANIFEST_NAME.encode()
Snapshot = dict[bytes, tuple]

PLAIN_NAMES = ("model.bin", "a b", " lead", "trail ", "ünïcødé", "日本語.pt", "🙂", "-rf",
               "new\nline", "*?[x]", "x" * 120, "manifest.json", ".metadata.json",
               ".staging", "checkpoint_000000", ".hidden")
NAMES = st.one_of(
    st.sampled_from(PLAIN_NAMES),
    st.text(st.characters(codec="utf-8", exclude_characters="/\x00"),
            min_size=1, max_size=8),
).map(str.encode).filter(lambda name: name not in (b".", b"..", b"exp") and len(name) < 200)
NOT_UTF8 = st.binary(max_size=4).map(
    lambda tail: b"bad\xff" + tail.replace(b"/", b"").replace(b"\x00", b""))
PLACES = (b"dataset-file", b"dataset-dir", b"storage-root", b"working-dir", b"example-root",
          b"experiment", b"nowhere", b"tree-root")
DIR_NAMES = (None,) * 12 + ("best model", "ünï", "../escape", "manifest.json", ".staging",
                            "checkpoint_000000")
FILENAMES = ("state.pt", "state.pt", "a b/ü.pt", "../out.pt", "manifest.json")


@dataclass(frozen=True)
class Entry:
    """One thing in the tree: ``target`` is a tree path, or ``/place`` (PLACES)."""

    path: bytes
    kind: str  # file, dir, link, hardlink, experiment
    content: bytes = b""
    target: bytes = b""
    relative: bool = False


@dataclass(frozen=True)
class Report:
    """One report(): of the first run (``how``: hand, upload_fn, save_state), or the
    resume's (hand, hand-back: the checkpoint it resumed from)."""

    how: str
    mode: str
    delete_local: bool | None
    dir_name: str | None
    filename: str = "state.pt"


@dataclass(frozen=True)
class Example:
    """One tree, where it lies, and what each step does with it."""

    tree: tuple[Entry, ...]
    placement: str
    cwd: str
    reports: tuple[Report, ...]
    to_directory: str
    export: tuple[str, str]
    gc: tuple[int | None, bool]
    resume: Report
    fault: Fault


@dataclass(frozen=True)
class Fault:
    """A failure injected into the first run (#65): the ``occurrence``-th file operation of
    the hand-overs (a rename or a copy) fails with ``error`` (errno), or the
    ``occurrence``-th commit of a checkpoint fails; after it and after the next start, every
    file gone from the tree is in a committed checkpoint that verifies."""

    at: str  # hand-over, commit
    occurrence: int
    error: int


@st.composite
def trees(draw: st.DrawFn) -> tuple[Entry, ...]:
    entries: list[Entry] = []
    dirs: list[bytes] = [b""]
    files: list[bytes] = []
    for _ in range(draw(st.integers(0, 9))):
        parent = draw(st.sampled_from(dirs))
        path = os.path.join(parent, draw(NAMES))
        if any(e.path == path for e in entries):
            continue
        kind = draw(st.sampled_from(("file", "file", "file", "dir", "link", "link", "hardlink",
                                     "experiment", "read-only file", "read-only dir")))
        if kind == "experiment" and any(e.kind == "experiment" for e in entries):
            kind = "dir"
        target, relative = b"", draw(st.booleans())
        if kind == "link":
            target = draw(st.sampled_from([b"/" + p for p in PLACES] + dirs[1:] + files))
        elif kind == "hardlink":
            target = draw(st.sampled_from([b"/dataset-file"] + files))
        entries.append(Entry(path, kind, draw(st.binary(max_size=64)), target, relative))
        (dirs if kind in ("dir", "read-only dir") else
         files if kind in ("file", "hardlink", "read-only file") else []).append(path)
    if draw(st.integers(0, 9)) == 7:  # not 0 or 9, which hypothesis draws far more often
        entries.append(Entry(os.path.join(draw(st.sampled_from(dirs)), draw(NOT_UTF8)), "file"))
    return tuple(entries)


def reports(hows: tuple[str, ...]) -> st.SearchStrategy[Report]:
    return st.builds(Report, st.sampled_from(hows), st.sampled_from(("sync", "async")),
                     st.sampled_from((None, True, False)), st.sampled_from(DIR_NAMES),
                     st.sampled_from(FILENAMES))


EXAMPLES_STRATEGY = st.builds(
    Example,
    trees(),
    st.sampled_from(("plain", "plain", "in-foreign-experiment", "in-storage", "storage-root",
                     "in-experiment", "via-link")),
    st.sampled_from(("work", "handed", "root", "storage")),
    st.lists(st.one_of(reports(("hand", "hand", "upload_fn", "save_state")),
                       st.builds(Report, st.just("hand"), st.just("async"),
                                 st.sampled_from((None, True)), st.sampled_from(DIR_NAMES),
                                 st.sampled_from(FILENAMES))),
             min_size=1, max_size=2).map(tuple),
    st.sampled_from(("fresh", "default", "itself", "experiment", "foreign")),
    st.tuples(st.sampled_from(("fresh", "empty", "experiment", "checkpoint", "foreign")),
              st.sampled_from(("--latest", "--best", "--index=0"))),
    st.tuples(st.sampled_from((None, 1, 2)), st.booleans()),
    reports(("hand", "hand-back")),
    st.builds(Fault, st.sampled_from(("hand-over", "hand-over", "commit")), st.integers(1, 2),
              st.sampled_from((errno.EACCES, errno.ENOSPC, errno.EXDEV))),
)


@dataclass
class World:
    """One example's directory: every byte under it, but the experiment's and ``out``'s, is
    watched."""

    root: Path
    template: Path
    handed: Path = field(init=False)
    tree: Path = field(init=False)
    cwd: Path = field(init=False)
    experiments: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        for directory in (self.dataset / "train", self.storage, self.work, self.out):
            directory.mkdir(parents=True)
        (self.dataset / "labels.csv").write_bytes(b"x,y\n")
        (self.dataset / "train" / "a.bin").write_bytes(b"a" * 100)
        shutil.copytree(self.template, self.foreign, symlinks=True)
        self.experiments += [self.experiment, self.foreign]

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    @property
    def storage(self) -> Path:
        return self.root / "storage"

    @property
    def experiment(self) -> Path:
        return self.storage / "exp"

    @property
    def foreign(self) -> Path:
        return self.root / "foreign" / "e"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def out(self) -> Path:
        return self.root / "out"

    def place(self, name: bytes) -> bytes:
        return bytes({b"dataset-file": self.dataset / "labels.csv", b"dataset-dir": self.dataset,
                      b"storage-root": self.storage, b"working-dir": self.cwd,
                      b"example-root": self.root, b"experiment": self.experiment,
                      b"nowhere": self.root / "nowhere", b"tree-root": self.tree}[name])


def _reports_a_small_checkpoint(config: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "w.bin").write_bytes(b"w" * 10)
        hpckit.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d))


def make_template(storage: Path) -> Path:
    """A committed experiment of one checkpoint, copied wherever an example needs one (each
    fit() costs MPI communicators, so an example runs only its own two)."""
    fit(_reports_a_small_checkpoint, storage, "e", {})
    return storage / "e"


def place_tree(world: World, placement: str) -> None:
    handed = {"plain": world.root / "handed", "in-storage": world.storage / "handed",
              "storage-root": world.storage, "in-experiment": world.experiment / "handed",
              "in-foreign-experiment": world.foreign / "handed",
              "via-link": world.root / "handed"}[placement]
    handed.mkdir(parents=True, exist_ok=True)
    world.tree = world.handed = handed
    if placement == "via-link":
        world.handed = world.root / "alias"
        world.handed.symlink_to(handed)


def build_tree(world: World, tree: tuple[Entry, ...]) -> None:
    """The tree as drawn; its read-only folders are made so once everything is in them, as
    a user's read-only copy of a pretrained model is (the fuzzing processes run without the
    capabilities that let root ignore permissions)."""
    root = bytes(world.tree)
    read_only: list[bytes] = []
    for entry in tree:
        path = os.path.join(root, entry.path)
        if entry.kind in ("file", "read-only file"):
            with open(path, "wb") as f:
                f.write(entry.content)
            if entry.kind == "read-only file":
                os.chmod(path, 0o444)
        elif entry.kind in ("dir", "read-only dir"):
            os.mkdir(path)
            if entry.kind == "read-only dir":
                read_only.append(path)
        elif entry.kind == "experiment":
            nested = Path(os.fsdecode(path)) / "nested"
            shutil.copytree(world.template, nested, symlinks=True)
            world.experiments.append(nested)
        else:
            target = (world.place(entry.target[1:]) if entry.target.startswith(b"/")
                      else os.path.join(root, entry.target))
            if entry.kind == "hardlink":
                os.link(target, path)
            else:
                os.symlink(os.path.relpath(target, os.path.dirname(path)) if entry.relative
                           else target, path)
    for path in reversed(read_only):
        os.chmod(path, 0o555)


def describe(path: bytes) -> tuple:
    """What a path is, never through a link: its type, and its target, mode or content."""
    status = os.lstat(path)
    if stat.S_ISLNK(status.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(status.st_mode):
        return ("dir", stat.S_IMODE(status.st_mode))
    if stat.S_ISREG(status.st_mode):
        with open(path, "rb") as f:
            return ("file", stat.S_IMODE(status.st_mode), hashlib.sha256(f.read()).hexdigest())
    return ("other", status.st_mode)


def snapshot(world: World) -> Snapshot:
    """Every path under the example's root but the experiment's and ``out``'s."""
    root, skipped = bytes(world.root), {bytes(world.experiment), bytes(world.out)}
    found: Snapshot = {}
    for parent, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(parent, d) not in skipped]
        for name in dirs + names:
            path = os.path.join(parent, name)
            found[os.path.relpath(path, root)] = describe(path)
    return found


def is_an_experiment(directory: bytes) -> bool:
    """An hpckit experiment holds hpckit's own manifest; a file merely named manifest.json
    (as many projects hold) does not make one."""
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as f:
            return json.loads(f.read()).get("format") == "hpckit.manifest"
    except (OSError, ValueError, AttributeError):
        return False


def in_an_experiment(path: bytes) -> bool:
    current = os.path.dirname(path)
    while True:
        if is_an_experiment(current):
            return True
        if os.path.dirname(current) == current:
            return False
        current = os.path.dirname(current)


def may_go(world: World, handed: Path | None, before: Snapshot) -> set[bytes]:
    """What report() may take of ``handed`` by the ownership rule: its regular files with one
    link, reached through no link, in no experiment; the directories that left empty, but
    one that holds the working directory."""
    if handed is None:
        return set()
    root, real = bytes(world.root), os.path.realpath(bytes(handed))
    allowed = set()
    for name, kind in before.items():
        path = os.path.join(root, name)
        if not (path == real or path.startswith(real + b"/")) or in_an_experiment(
                os.path.join(path, b"x") if kind[0] == "dir" else path):
            continue
        if kind[0] == "file" and os.lstat(path).st_nlink == 1:
            allowed.add(name)
        elif kind[0] == "dir" and not _holds(path, bytes(world.cwd)):
            allowed.add(name)
    return allowed


def _holds(directory: bytes, path: bytes) -> bool:
    directory, path = os.path.realpath(directory), os.path.realpath(path)
    return path == directory or path.startswith(directory + b"/")


def _changes(before: Snapshot, after: Snapshot, allowed: set[bytes]) -> list[str]:
    new = sorted(after.keys() - before.keys())
    gone = sorted(before.keys() - after.keys() - allowed)
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    return ([f"new {n!r}" for n in new] + [f"removed {n!r} {before[n]}" for n in gone]
            + [f"changed {n!r}: {before[n]} -> {after[n]}" for n in changed])


def assert_every_checkpoint_verifies(world: World) -> None:
    for experiment in world.experiments:
        if (experiment / "manifest.json").is_file():
            verified = CliRunner().invoke(main, ["verify", str(experiment)])
            assert verified.exit_code == 0, f"{experiment}:\n{verified.output}"


def committed_contents(world: World) -> set[str]:
    """The digests of every file of the experiment's committed checkpoints."""
    manifest = read_manifest(resolve(str(world.experiment)))
    found = set()
    for record in manifest.checkpoints if manifest else ():
        for parent, _, names in os.walk(world.experiment / record.directory):
            for name in names:
                with open(os.path.join(parent, name), "rb") as f:
                    found.add(hashlib.sha256(f.read()).hexdigest())
    return found


@contextlib.contextmanager
def watched(world: World, step: str, handed: Path | None = None) -> Iterator[None]:
    """Run ``step``: afterwards nothing outside the experiment changed but what report() may
    take of ``handed``, every file it took is in a committed checkpoint (never only in
    staging, or in a checkpoint that did not commit), and every committed checkpoint
    verifies."""
    before = snapshot(world)
    allowed = may_go(world, handed, before)
    yield
    after = snapshot(world)
    changes = _changes(before, after, allowed)
    assert not changes, f"{step} changed what is not the experiment's:\n" + "\n".join(changes)
    kept = committed_contents(world)
    lost = sorted(name for name in before.keys() - after.keys()
                  if before[name][0] == "file" and before[name][2] not in kept)
    assert not lost, f"{step} took files no committed checkpoint holds: {lost}"
    assert os.path.isdir(world.cwd), f"{step} removed the working directory"
    assert_every_checkpoint_verifies(world)


def assert_an_hpckit_refusal(error: HpckitError) -> None:
    """A failed fit() is an hpckit error in every rank's cause too, never another type."""
    causes: list[BaseException] = [error]
    if isinstance(error, WorkerGroupError):
        causes = list(error.worker_failures.values())
    elif isinstance(error, ControllerError):
        causes = [error.controller_failure]
    for cause in causes:
        assert isinstance(cause, HpckitError), "".join(traceback.format_exception(cause))
        OUTCOMES["refused"][_reason(str(cause))] += 1
        event(f"refused: {_reason(str(cause))}")


def _reason(message: str) -> str:
    for reason in ("is not UTF-8", "not a plain relative path", "is not a regular file",
                   "must be a relative path", "checkpoint_dir_name"):
        if reason in message:
            return reason
    return re.sub(r"/\S*", "PATH", message.splitlines()[0])[:160]


def fit(train: Any, storage: Path, name: str, config: dict) -> hpckit.Result | None:
    try:
        result = DataParallelTrainer(train, train_loop_config=config, run_config=RunConfig(
            name=name, storage_path=str(storage))).fit()
    except HpckitError as error:
        assert_an_hpckit_refusal(error)
        return None
    assert result.error is None
    return result


def copies_files(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
    """A user's checkpoint_upload_fn: copies the regular files, as a user's copy would."""
    source = os.fsencode(checkpoint.path)
    target = os.path.join(os.fsencode(hpckit.get_context().get_experiment_path()),
                          os.fsencode(checkpoint_dir_name))
    for parent, _, names in os.walk(source):
        for name in names:
            path = os.path.join(parent, name)
            if os.path.isfile(path):
                copy = os.path.join(target, os.path.relpath(path, source))
                os.makedirs(os.path.dirname(copy), exist_ok=True)
                shutil.copyfile(path, copy)
    return Checkpoint.from_directory(os.fsdecode(target))


def _reported(report: Report, checkpoint: Checkpoint | None, step: int) -> None:
    options: dict[str, Any] = {"checkpoint_upload_mode": report.mode,
                               "delete_local_checkpoint_after_upload": report.delete_local}
    if report.dir_name is not None:
        options["checkpoint_dir_name"] = f"{report.dir_name}-{step}" if step else report.dir_name
    if report.how == "upload_fn":
        options["checkpoint_upload_fn"] = copies_files
    hpckit.report({"step": step}, checkpoint=checkpoint, **options)


def hands_the_tree(config: dict) -> None:
    for step, report in enumerate(config["reports"]):
        if report.how == "save_state":
            import torch

            from hpckit.torch import save_state
            checkpoint = save_state({"x": torch.arange(3.0)}, report.filename)
        else:
            checkpoint = Checkpoint.from_directory(config["handed"])
        _reported(report, checkpoint, step)


def resumes(config: dict) -> None:
    found = hpckit.get_checkpoint()
    config["found"].append(None if found is None else os.path.basename(found.path))
    report: Report = config["report"]
    checkpoint = found if report.how == "hand-back" else Checkpoint.from_directory(
        config["handed"])
    if report.how == "hand-back" and found is None:
        checkpoint = None
    _reported(report, checkpoint, 7)


def latest(world: World) -> str | None:
    manifest = read_manifest(resolve(str(world.experiment)))
    return None if manifest is None or manifest.latest is None else manifest.latest.directory


def to_directory_target(world: World, where: str) -> str | None:
    committed = latest(world)
    return {"fresh": str(world.out / "copy"), "default": None,
            "itself": str(world.experiment / committed) if committed else None,
            "experiment": str(world.experiment),
            "foreign": str(world.foreign / "checkpoint_000000")}[where]


def uses_the_checkpoint(world: World, where: str) -> None:
    """as_directory, to_directory (a copy, or onto what is an experiment's), update_metadata
    (refused on a committed checkpoint, done on a copy)."""
    committed = latest(world)
    if committed is None:
        return
    checkpoint = Checkpoint(str(world.experiment / committed))
    with checkpoint.as_directory() as directory:
        assert os.path.realpath(directory) == os.path.realpath(checkpoint.path)
    try:
        copy = checkpoint.to_directory(to_directory_target(world, where))
    except HpckitError:
        copy = None
    with pytest.raises(CheckpointError, match="is a committed checkpoint"):
        checkpoint.update_metadata({"note": "best"})
    if copy is not None and where in ("fresh", "default"):
        try:  # refused, naming the file, where the tree's .metadata.json is not a JSON object
            Checkpoint.from_directory(copy).update_metadata({"note": "best"})
        except CheckpointError as exc:
            assert "is not checkpoint metadata" in str(exc), exc
        else:
            assert Checkpoint.from_directory(copy).get_metadata()["note"] == "best"


def exports(world: World, where: str, which: str) -> None:
    committed = latest(world) or "checkpoint_000000"
    target = {"fresh": world.out / "export", "empty": world.out / "empty",
              "experiment": world.experiment / "elsewhere",
              "checkpoint": world.experiment / committed,
              "foreign": world.foreign / "checkpoint_000000"}[where]
    if where == "empty":
        target.mkdir(exist_ok=True)
    result = CliRunner().invoke(main, ["export", which, str(world.experiment), str(target)])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        "".join(traceback.format_exception(result.exception))
    if where in ("fresh", "empty") and latest(world) is not None and which != "--index=0":
        assert result.exit_code == 0, result.output
    if where in ("experiment", "checkpoint", "foreign") and result.exit_code == 0:
        raise AssertionError(f"export into an experiment ({target}) was not refused")


def collects_garbage(world: World, keep: int | None, dry_run: bool) -> None:
    before = latest(world)
    words = ["gc", str(world.experiment)] + ([f"--keep={keep}"] if keep else [])
    result = CliRunner().invoke(main, words + (["--dry-run"] if dry_run else []))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        "".join(traceback.format_exception(result.exception))
    if before is not None:
        assert result.exit_code == 0, result.output
        assert latest(world) == before and (world.experiment / before).is_dir()


@contextlib.contextmanager
def injected(fault: Fault) -> Iterator[None]:
    """``fault`` made to happen: the hand-over's renames and copies, and the experiment's
    commits, fail at the chosen call, as a full disk, a refused permission or another
    filesystem would make them (an injection: they cannot be timed for real)."""
    from hpckit.experiment.experiment import Experiment
    from hpckit.run.writing import staging

    calls: collections.Counter[str] = collections.Counter()

    def failing(at: str, what: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[at] += 1
            if at == fault.at and calls[at] == fault.occurrence:
                OUTCOMES["faults"][what] += 1
                event(f"fault injected at {what}")
                if at == "commit":
                    raise StorageError(f"injected: {os.strerror(fault.error)}")
                raise OSError(fault.error, os.strerror(fault.error))
            return real(*args, **kwargs)
        return call

    saved = staging._rename, staging._copy, Experiment.commit
    staging._rename = failing("hand-over", "rename", staging._rename)
    staging._copy = failing("hand-over", "copy", staging._copy)
    Experiment.commit = failing("commit", "commit", Experiment.commit)  # type: ignore[method-assign]
    try:
        yield
    finally:
        staging._rename, staging._copy, Experiment.commit = saved  # type: ignore[method-assign]


def first_run(world: World, example: Example) -> None:
    with watched(world, "report()", world.handed), injected(example.fault):
        fit(hands_the_tree, world.storage, "exp",
            {"handed": str(world.handed), "reports": example.reports})
    OUTCOMES["trees"] += 1
    OUTCOMES["committed"] += latest(world) is not None
    event(f"first run: {'a checkpoint committed' if latest(world) else 'none committed'}")


def resume(world: World, report: Report) -> None:
    expected, found = latest(world), list[str | None]()
    handed = None if report.how == "hand-back" else world.handed
    with watched(world, "the resume's report()", handed):
        fit(resumes, world.storage, "exp",
            {"handed": str(world.handed), "report": report, "found": found})
    if found:
        assert found == [expected], f"the resume found {found[0]}, not {expected}"


def drive(world: World, example: Example) -> None:
    place_tree(world, example.placement)
    world.cwd = {"work": world.work, "handed": world.tree, "root": world.root,
                 "storage": world.storage}[example.cwd]
    build_tree(world, example.tree)
    os.chdir(world.cwd)
    first_run(world, example)
    with watched(world, "Checkpoint.to_directory/as_directory/update_metadata"):
        uses_the_checkpoint(world, example.to_directory)
    with watched(world, "hpckit export"):
        exports(world, *example.export)
    with watched(world, "hpckit gc"):
        collects_garbage(world, *example.gc)
    resume(world, example.resume)


def fuzz(root: Path, chunk: int, examples: int, shrink: bool) -> None:
    """Drive ``examples`` trees, drawn with seed ``chunk``, in this process; print how many
    committed a checkpoint."""
    template = make_template(root / "template")
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ())

    @seed(chunk)
    @settings(max_examples=examples, deadline=None, database=None, phases=phases,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(example=EXAMPLES_STRATEGY)
    def one_tree(example: Example) -> None:
        home = os.getcwd()
        world = World(Path(tempfile.mkdtemp(dir=root)), template)
        try:
            drive(world, example)
        finally:
            os.chdir(home)
            for parent, dirs, _ in os.walk(world.root):  # the tree's read-only folders
                for name in dirs:
                    path = os.path.join(parent, name)
                    if not os.path.islink(path):
                        os.chmod(path, 0o755)
            shutil.rmtree(world.root)

    one_tree()
    print(f"FUZZED {json.dumps(OUTCOMES)}")


def _environment(root: Path) -> dict[str, str]:
    """A fuzzing process's: quiet logs, to_directory()'s default copies under ``root``, and
    this clone's hpckit."""
    paths = (str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", ""))
    return {"HPCKIT_LOG_LEVEL": "WARNING", "HPCKIT_LOCAL_DIR": str(root / "local"),
            "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def test_no_tree_makes_hpckit_change_what_is_not_its_own(tmp_path: Path) -> None:
    """``FUZZED_TREES`` trees, PER_PROCESS to a process of their own (seeds 0, 1, ...):
    each in-process fit() keeps MPI communicators, and the trees' fits are many."""
    trees = committed = faults = 0
    for chunk in range(math.ceil(EXAMPLES / PER_PROCESS)):
        examples = min(PER_PROCESS, EXAMPLES - chunk * PER_PROCESS)
        root = tmp_path / f"chunk-{chunk}"
        (root / "local").mkdir(parents=True)
        done = run([*AS_A_USER, sys.executable, __file__, str(root), str(chunk), str(examples)],
                   timeout=900, env=_environment(root))
        shutil.rmtree(root)
        outcomes = json.loads(done.line("FUZZED") or "{}")
        trees, committed = trees + outcomes["trees"], committed + outcomes["committed"]
        faults += sum(outcomes["faults"].values())
    assert trees >= EXAMPLES, f"{trees} trees ran, not {EXAMPLES}"
    assert committed >= trees // 4, f"only {committed} of {trees} trees committed a checkpoint"
    # The other trees are refused first (a broken link, a name that is not UTF-8), or hand
    # nothing over; each fault still lands in dozens of trees, every kind of it.
    assert faults >= trees // 6, f"only {faults} of {trees} trees met their injected failure"


if __name__ == "__main__":
    fuzz(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
         os.environ.get("FUZZED_TREES_SHRINK") == "1")
