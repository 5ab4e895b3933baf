"""What hpckit may move or delete of a directory handed to it: the one rule.

A checkpoint tool holds the only copy of weeks of work, so it changes nothing it does not
own. Its own are its experiment's files, its staging and the pending checkpoint, which it
made. Of a directory the user hands to ``report()`` it may take (move, then delete) only
what Ray would delete after the upload, and less:

- a regular file with a single link (a hard-linked file's other name would lose its bytes
  on a truncate, and its content is not the directory's to give away),
- reached from the handed directory through no symbolic link (a link to the dataset, or to
  a directory above the storage root, leads to what is not the checkpoint's),
- in no experiment (a directory that holds hpckit's own manifest), above the handed
  directory or within it: a committed checkpoint of any experiment, handed again, is read, never taken,
  and neither is an experiment that a handed directory happens to hold.

The handed directory itself is removed only when hpckit took everything in it and it holds
neither the working directory nor a home. Everything else is copied and left as it was.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat

from hpckit.experiment.manifest import MANIFEST_NAME


def may_take(directory: str, name: str) -> bool:
    """Whether hpckit may move and delete file ``name`` (a relative POSIX path) of the
    handed ``directory``: not through a link, nor in an experiment nested in it."""
    path = directory
    for part in name.split("/"):
        if is_experiment(path):
            return False
        path = os.path.join(path, part)
        if os.path.islink(path):
            return False
    try:
        status = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and status.st_nlink == 1


def in_experiment(path: str) -> bool:
    """Whether ``path`` lies in an experiment directory, any experiment's (links resolved)."""
    return experiment_of(path) is not None


def why_kept(directory: str) -> str | None:
    """Why the handed ``directory`` must stay, whatever its files; None when hpckit may
    remove it once it took them."""
    if in_experiment(directory):
        return "which lies in an experiment (its files are copied, never moved)"
    home = os.path.expanduser("~")
    for kept, what in ((os.getcwd(), "the current directory"), (home, "your home directory")):
        if inside(kept, directory):
            return f"which holds {what}"
    return None


def remove_taken(directory: str, names: list[str]) -> None:
    """Delete the files of ``directory`` that hpckit may take among ``names``, then the
    directories that left empty, ``directory`` itself last; never through a link. Their
    content is persisted by now: what cannot be deleted stays, as Ray leaves it."""
    for name in names:
        if may_take(directory, name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
    prune(directory, names)


def prune(directory: str, names: list[str]) -> None:
    """Remove the directories that taking ``names`` out of ``directory`` left empty, up to
    ``directory`` itself; ``rmdir`` never follows a link and never removes what is not empty."""
    parents = {os.path.dirname(os.path.join(directory, name)) for name in names} | {directory}
    for parent in sorted(parents, key=len, reverse=True):
        while _holds_name(directory, parent) and not os.path.islink(parent):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)


def names_in(directory: str) -> list[str]:
    """Every entry of ``directory`` but its directories, as relative POSIX paths, without
    following a link (a link is an entry: hpckit never takes what it points to)."""
    found = []
    for parent, _, names in os.walk(directory):
        found += [os.path.relpath(os.path.join(parent, n), directory).replace(os.sep, "/")
                  for n in names]
    return found


def _holds_name(directory: str, path: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


_MANIFEST_HEAD = re.compile(rb'\A\{\s*"format":\s*"hpckit\.manifest",\s*"format_version":\s*\d+')


def is_experiment(directory: str) -> bool:
    """Whether the local ``directory`` is an hpckit experiment: it holds hpckit's own
    manifest (``manifest.json`` that opens with hpckit's format and its version), not merely
    a file of that name, which many projects have."""
    try:
        with open(os.path.join(directory, MANIFEST_NAME), "rb") as f:
            return _MANIFEST_HEAD.match(f.read(256)) is not None
    except OSError:
        return False


def experiment_of(path: str) -> str | None:
    """The experiment directory (:func:`is_experiment`) that the local ``path`` lies in,
    itself or above, links resolved; None where there is none. ``path`` may not exist."""
    current = os.path.realpath(path)
    while True:
        if is_experiment(current):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def inside(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it (local paths, links resolved)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory
