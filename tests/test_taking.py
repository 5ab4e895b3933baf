"""Taking is a transaction (#65): what an asynchronous report() moves out of a handed
directory is written down first, and goes back where it was on any failure before its
checkpoint commits (a refusal at a later report, Ctrl-C, a kill, which the next start
replays); what cannot all be taken is copied; a directory several ranks hand is never moved
from. On real ranks; tests/test_fuzzed_trees.py injects failures at every step of the
hand-over and at the commit, and the last test here SIGKILLs one hand-over's life right
after each of its file operations, in a forked child, and replays it as the next start
would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import HERE, HPCKIT, MPIEXEC, manifest, mpiexec, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpckit.experiment import journal
from hpckit.experiment.manifest import STAGING_NAME, checkpoint_dirname
from hpckit.run.writing.shares import _link
from hpckit.run.writing.staging import Staging, hand_over
from hpckit.storage.location import resolve

TAKING = HERE / "ranks" / "taking.py"
# Root without the capabilities that let it ignore permissions: a user's view of a 0555
# folder (the tests run as root, which would otherwise rename out of it).
AS_A_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def seen(output: str, name: str) -> object:
    found = re.findall(rf"SEEN {re.escape(name)} (.*)", output)
    assert found, f"no SEEN {name}:\n{output}"
    return json.loads(found[-1])


def tree(directory: Path) -> dict[str, object]:
    """Every entry under ``directory``: files with content and mode, folders with mode."""
    found: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        mode = oct(path.lstat().st_mode & 0o7777)
        found[str(path.relative_to(directory))] = (
            (path.read_bytes(), mode) if path.is_file() else mode)
    return found


def committed_files(experiment: Path, directory: str = "checkpoint_000000") -> dict[str, bytes]:
    root = experiment / directory
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not str(p.relative_to(root)).startswith(".hpckit")}


def model_folder(root: Path, files: int = 4) -> Path:
    handed = root / "handed"
    (handed / "sub").mkdir(parents=True)
    for i in range(files):
        (handed / ("sub" if i % 2 else "") / f"part-{i}.bin").write_bytes(bytes([i]) * 100)
    os.utime(handed / "sub", ns=(1_000_000_000, 1_000_000_000))
    return handed


def test_read_only_entries_are_copied_and_nothing_is_partly_moved(tmp_path):
    """A pretrained backbone.pt at 0444 in a 0555 pretrained/, as a user without root has
    it: hpckit moved model.pt, then failed on backbone.pt and left the rest where the next
    cleanup removed it. Now it sees first that not all can be taken, copies them all, and
    removes what it may once the checkpoint holding them committed."""
    handed = tmp_path / "handed"
    (handed / "pretrained").mkdir(parents=True)
    (handed / "model.pt").write_bytes(b"weights")
    (handed / "frozen.txt").write_bytes(b"frozen")
    (handed / "pretrained" / "backbone.pt").write_bytes(b"backbone")
    os.chmod(handed / "frozen.txt", 0o444)
    os.chmod(handed / "pretrained" / "backbone.pt", 0o444)
    os.chmod(handed / "pretrained", 0o555)
    before = tree(handed)
    try:
        out = run([*AS_A_USER, sys.executable, str(TAKING), "read-only", "--storage",
                   str(tmp_path / "runs"), "--handed", str(handed), "--workers", "2"],
                  timeout=120).output
    finally:
        os.chmod(handed / "pretrained", 0o755)
    assert manifest(tmp_path / "runs" / "exp")["latest"] == "checkpoint_000000", out
    listed = {name: (content, mode) for name, (content, mode) in (
        (k, (v[0].decode(), v[1])) for k, v in before.items() if isinstance(v, tuple))}
    assert {k: v for k, v in seen(out, "after_report").items() if not k.endswith("/")} == {
        name: content for name, (content, _) in listed.items()}, out
    assert committed_files(tmp_path / "runs" / "exp") == {
        "model.pt": b"weights", "frozen.txt": b"frozen", "pretrained/backbone.pt": b"backbone"}
    assert tree(handed) == {"pretrained": "0o755",  # restored above, to clean up
                            "pretrained/backbone.pt": (b"backbone", "0o444")}


def test_a_directory_several_ranks_hand_is_never_moved_from(tmp_path):
    """Each rank writes its shard into one directory on the shared filesystem and hands it:
    rank 1 failed with FileNotFoundError (rank 0 had moved the files it copies) and both
    shards were lost. Now neither moves; the directory goes once the checkpoint holding
    both shards committed."""
    handed = tmp_path / "ckpt-epoch0"
    handed.mkdir()
    out = mpiexec(3, "shared", "--storage", str(tmp_path / "runs"), "--handed", str(handed),
                  script=TAKING, timeout=120).output
    assert manifest(tmp_path / "runs" / "exp")["latest"] == "checkpoint_000000", out
    assert committed_files(tmp_path / "runs" / "exp") == {
        f"model-rank={r}.pt": bytes([r]) * 1000 for r in range(3)}, out
    assert not handed.exists(), list(handed.iterdir())


@pytest.mark.parametrize("again", ["bad-name", "same", "taken-name", "miscounted"])
def test_a_refused_report_commits_what_was_persisted_before_it(tmp_path, again):
    """An ASYNC report persisted checkpoint_000000 from a handed directory; the next report
    is refused (a name that is not UTF-8; the same Checkpoint object again, whose directory
    ASYNC took; the checkpoint_dir_name of the checkpoint still in flight, refused as rank 0
    prepares the directory; a report on rank 0 alone, as rank 1 returns). The manifest held
    nothing and the handed files survived only in a directory the next run removes. Now the
    persisted checkpoint commits, then the refusal is raised."""
    handed = model_folder(tmp_path)
    before = tree(handed)
    out = mpiexec(2, "refused-after", "--storage", str(tmp_path), "--handed", str(handed),
                  "--again", again, script=TAKING, timeout=120, expect=1).output
    assert re.search(r"RAISED \w+: .*(not UTF-8|does not exist|already exists)", out) or (
        again == "miscounted" and re.search(r"RAISED \w+: .*ReportMismatchError: ranks disagree",
                                            out)), out
    first = "best" if again == "taken-name" else "checkpoint_000000"
    assert manifest(tmp_path / "exp")["latest"] == first, out
    assert committed_files(tmp_path / "exp", first) == {
        name: content for name, (content, _) in (
            (k, v) for k, v in before.items() if isinstance(v, tuple))}, out
    if again == "bad-name":
        assert os.listdir(os.fsencode(tmp_path / "bad")) == [b"bad\xff.pt"]


def test_files_put_back_after_a_commit_they_did_not_hear_of_are_the_users_own(tmp_path):
    """The ranks fail while rank 0 commits an ASYNC report's checkpoint in the background:
    the commit lands, and the ranks, which never heard of it, put the moved files back. The
    committed files are links to the staged ones; those put back must be files of their
    own, or the user's next save over one (torch.save truncates in place) would change the
    committed checkpoint."""
    handed = model_folder(tmp_path)
    before = tree(handed)
    out = mpiexec(2, "failed-after-commit", "--storage", str(tmp_path), "--handed", str(handed),
                  script=TAKING, timeout=120, expect=1).output
    assert "the training fails" in out, out
    assert manifest(tmp_path / "exp")["latest"] == "checkpoint_000000", out
    originals = {name: content for name, (content, _) in (
        (k, v) for k, v in before.items() if isinstance(v, tuple))}
    checkpoint = tmp_path / "exp" / "checkpoint_000000"
    for name in originals:
        if (handed / name).exists():
            assert not os.path.samefile(handed / name, checkpoint / name), name
            (handed / name).write_bytes(b"the user's next save")
    assert committed_files(tmp_path / "exp") == originals, out
    verified = subprocess.run([HPCKIT, "verify", str(tmp_path / "exp")], capture_output=True,
                              text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _taken(source: Path, staging: Path, index: int, content: bytes,
           directory: str | None = None) -> None:
    """What an ASYNC report's hand-over does to ``source``'s model.pt for checkpoint
    ``index`` (named ``directory``): the journal written, then the file moved into the
    rank's staging."""
    directory = directory or checkpoint_dirname(index)
    (source / "model.pt").write_bytes(content)
    staged = staging / "rank-0" / directory
    staged.mkdir(parents=True)
    journal.Journal.before_moving(str(source), str(staged), directory, index, ["model.pt"])
    os.rename(source / "model.pt", staged / "model.pt")


@pytest.mark.quick
@pytest.mark.parametrize("names", [(None, None), ("epoch-b", "epoch-a")])
def test_a_name_handed_twice_before_a_kill_gets_the_newer_file_back(tmp_path, names):
    """Two ASYNC reports took one folder's model.pt (the second after the user saved it
    again), and the rank was killed before either checkpoint committed: the next start puts
    back the newer file, not the older, whether the journals' names sort oldest first
    (numbered checkpoints) or not (names of the user's)."""
    source, staging = tmp_path / "handed", tmp_path / "staging"
    source.mkdir()
    _taken(source, staging, 9, b"saved first", names[0])
    _taken(source, staging, 10, b"saved since", names[1])
    assert journal.replay([str(staging)], next_index=9) == []
    assert (source / "model.pt").read_bytes() == b"saved since"
    assert not list(staging.rglob("*" + journal.SUFFIX))


@pytest.mark.quick
def test_files_kept_unsettled_survive_the_next_attempts_checkpoint_of_that_name(tmp_path):
    """A hand-over's files that could not go back stay in their staging, marked unsettled,
    for the user; the next attempt reaches the same checkpoint again (it never committed)
    and stages it elsewhere, never over them."""
    source, root = tmp_path / "handed", tmp_path / "exp" / STAGING_NAME
    source.mkdir()
    _taken(source, root, 3, b"only here")
    path = str(root / "rank-0" / checkpoint_dirname(3)) + journal.SUFFIX
    journal.keep_unsettled(path, OSError("the folder is gone"))
    staging = Staging(resolve(str(tmp_path / "exp")), 0, None)
    again = staging.for_files(str(source), checkpoint_dirname(3))
    assert again != str(root / "rank-0" / checkpoint_dirname(3))
    assert (root / "rank-0" / checkpoint_dirname(3) / "model.pt").read_bytes() == b"only here"


def test_ctrl_c_before_the_commit_puts_the_moved_files_back(tmp_path):
    """Ctrl-C while an ASYNC report's checkpoint is persisted but not yet committed: the
    files it moved go back, with their folders, modes and times."""
    handed = model_folder(tmp_path)
    before = tree(handed)
    times = os.stat(handed / "sub").st_mtime_ns
    process = subprocess.Popen(
        [sys.executable, str(TAKING), "interrupted", "--storage", str(tmp_path / "runs"),
         "--handed", str(handed), "--workers", "2"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    deadline = time.monotonic() + 90
    while not any("SEEN handed_over" in line for line in lines):
        assert time.monotonic() < deadline and process.poll() is None, "".join(lines)
        lines.append(process.stdout.readline())
    process.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C reaches python train.py
    output = "".join(lines) + process.communicate(timeout=60)[0]
    assert process.returncode in (130, -signal.SIGINT), output  # as Python ends on Ctrl-C
    assert seen(output, "handed_over") is None, output  # moved, folder and all
    assert tree(handed) == before, output
    assert os.stat(handed / "sub").st_mtime_ns == times
    assert "put 4 file(s) back into" in output, output


def test_a_rank_killed_mid_hand_over_gets_its_files_back_at_the_next_start(tmp_path):
    """Rank 0 is SIGKILLed after moving 2 of its 4 files: its journal stays in its staging,
    and the next start puts them back before anything of the staging is removed, before the
    training function runs."""
    handed = model_folder(tmp_path)
    before = tree(handed)
    args = ["killed", "--storage", str(tmp_path / "runs"), "--handed", str(handed),
            "--workers", "2"]
    killed = run([sys.executable, str(TAKING), *args], timeout=120, expect=None,
                 env={"HPCKIT_FAULT": "taking:0:2"})
    assert killed.returncode != 0, killed.output
    assert len(tree(handed)) == len(before) - 2, killed.output
    journals = list((tmp_path / "runs" / "exp" / ".staging").glob("rank-0/*.hpckit-journal"))
    assert len(journals) == 1, killed.output
    again = run([sys.executable, str(TAKING), *args], timeout=120).output
    assert {k: v for k, v in seen(again, "at_start").items() if not k.endswith("/")} == {
        name: content.decode() for name, (content, _) in (
            (k, v) for k, v in before.items() if isinstance(v, tuple))}, again
    assert manifest(tmp_path / "runs" / "exp")["latest"] == "checkpoint_000000", again
    assert "put 2 file(s) back into" in again, again


def test_fuzzed_folders_that_two_ranks_hand_lose_nothing_whatever_fails(tmp_path):
    """Hypothesis draws folders (read-only files, a read-only subfolder) that both ranks
    hand at once, in each upload mode, with a failure injected on one rank at a rename or
    copy of the hand-over or at the commit (tests/ranks/shared_trees.py): no file is ever
    gone that the committed checkpoint does not hold, and a report that succeeded committed
    every file. Run without the capabilities that let root ignore permissions."""
    out = run([*AS_A_USER, MPIEXEC, "-n", "2", sys.executable,
               str(HERE / "ranks" / "shared_trees.py"), str(tmp_path), "0", "200"],
              timeout=300, env={"HPCKIT_LOG_LEVEL": "ERROR"}).output
    counts = seen_counts(out)
    assert counts["examples"] == 200, out
    assert counts["committed"] >= 60, counts
    assert counts.get("fault at hand-over", 0) >= 20 and counts.get("fault at commit", 0) >= 10, \
        counts


def seen_counts(output: str) -> dict[str, int]:
    found = re.search(r"SHARED (\{.*\})", output)
    assert found, output
    return json.loads(found.group(1))


# One hand-over's life, SIGKILLed right after each of its file operations: the operations that
# change a tree, as the modules call them (shutil.rmtree and copyfile too go through them).
KILLABLE = (("os", "rename"), ("os", "replace"), ("os", "link"), ("os", "unlink"),
            ("os", "rmdir"), ("os", "mkdir"), ("shutil", "copyfile"), ("shutil", "copy2"))
COMMITTED = "COMMITTED"  # the manifest's replacement, as far as the hand-over can tell


def _life(source: str, staged: str, checkpoint: str, names: list[str], end: str) -> None:
    """A rank's part of one ASYNC report of ``source``: the hand-over, its files persisted
    into the checkpoint as links (shares.write_share on one filesystem), then as ``end``
    says: rank 0's commit and the staging released; the checkpoint given up and the files
    put back; or rank 0's commit landing while the rank, which never heard of it, gives the
    checkpoint up (the ranks failed as rank 0's committer committed)."""
    taken = hand_over(source, staged, names, [], True, set(), "checkpoint_000000", 0, 0)
    for name in names:
        _link(os.path.join(staged, name), os.path.join(checkpoint, name))
    if end != "given up":
        with open(os.path.join(checkpoint, COMMITTED + ".tmp"), "w") as f:
            f.write("1")
        os.replace(os.path.join(checkpoint, COMMITTED + ".tmp"), os.path.join(checkpoint, COMMITTED))
    if end == "committed":
        taken.committed()
    else:
        taken.abandoned("checkpoint_000000 did not commit")


def _killed_after(operations: int, *life: Any) -> bool:
    """``_life`` in a child process that SIGKILLs itself right after its ``operations``-th
    file operation; whether it was killed (False: it ended first)."""
    child = os.fork()
    if child == 0:
        try:
            os.fsync = lambda fd: None  # a killed process loses nothing written: no power cut
            count = 0
            for module, name in KILLABLE:
                real = getattr(sys.modules[module], name)

                def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                    nonlocal count
                    result = _real(*args, **kwargs)
                    count += 1
                    if count == operations:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return result

                setattr(sys.modules[module], name, counted)
            _life(*life)
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    return os.WIFSIGNALED(status)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


TREES = st.dictionaries(
    st.lists(st.sampled_from(["a", "b", "sub", "deep"]), min_size=1, max_size=3).map("/".join)
    .filter(lambda name: not any(name.startswith(other + "/") for other in ("a", "b"))),
    st.binary(min_size=1, max_size=64), min_size=1, max_size=6)


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=TREES, end=st.sampled_from(["committed", "given up", "committed unheard"]),
       operations=st.integers(1, 60))
def test_a_rank_killed_after_any_file_operation_of_a_hand_over_loses_nothing(
        tmp_path_factory, tree, end, operations):
    """SIGKILL right after each rename, link, copy, unlink, rmdir and journal write of one
    hand-over's life (taken, persisted as links, committed or given up), then the next start
    (the journals replayed against the manifest, the leftovers removed): the user's tree is
    byte-identical to its snapshot, or the checkpoint committed and holds it, with any file
    that went back a file of its own."""
    root = tmp_path_factory.mktemp("life")
    source, staging, checkpoint = root / "handed", root / STAGING_NAME, root / "checkpoint_000000"
    tree = {name: content for name, content in tree.items()
            if not any(other.startswith(name + "/") for other in tree)}
    for name, content in tree.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(content)
    staged = staging / "rank-0" / "checkpoint_000000"
    staged.mkdir(parents=True)
    killed = _killed_after(operations, str(source), str(staged), str(checkpoint),
                           sorted(tree), end)
    committed = (checkpoint / COMMITTED).exists()
    assert killed or committed == (end != "given up")
    unsettled = journal.replay([str(staging)], next_index=1 if committed else 0)
    assert unsettled == [], unsettled
    if not journal.found([str(staging)]):
        shutil.rmtree(staging)
    if committed:
        assert {n: c for n, c in _files(checkpoint).items() if n != COMMITTED} == tree
        for name in tree:
            if (source / name).exists():
                assert not os.path.samefile(source / name, checkpoint / name), name
                assert (source / name).read_bytes() == tree[name], name
    else:
        shutil.rmtree(checkpoint, ignore_errors=True)  # a leftover no manifest names
        assert _files(source) == tree
    assert not staging.exists() or not any(staging.rglob("*" + journal.SUFFIX))
