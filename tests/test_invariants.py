"""Promises of docs/architecture.md, read from the source so that a change that breaks
them fails here, before a Ctrl-C hang or a stray write shows up in a run:

1. Ranks wait for one another only through ``hpckit.run.mpi``: no other module calls a
   blocking MPI collective (where Ctrl-C cannot reach the waiting rank; see
   ``hpckit/run/mpi/waiting.py``), nor makes an MPI wait of its own.
2. The experiment directory changes only through its owners: the ``hpckit.experiment``
   package (``Experiment`` and its helpers) and the few named modules below, each for the
   files it alone writes. No other module calls the storage layer's writes, and on the
   ranks only named rooms change local files.
3. No ``assert`` guards hpckit's state (``python -O`` removes them).

Each check is also run on a planted violation, so that it cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "hpckit"

# mpi4py's blocking collectives and point-to-point calls (lower case: pickled objects;
# capitalised: buffers), and the nonblocking barrier whose wait hpckit polls in
# run.mpi.waiting. Creating a communicator (Dup, Split) is collective too; it happens at
# start-up and for a sweep's groups, before any stop can be agreed. MPI gives no wait that
# hpckit could make interruptible for it, so where ranks may come far apart the rank waits
# first in a barrier that sleeps (run.mpi.comm.duplicate), and the Dup itself is brief.
COLLECTIVES = frozenset(
    name for base in ("bcast", "gather", "allgather", "barrier", "allreduce", "reduce",
                      "scatter", "alltoall", "ibarrier", "send", "recv", "ssend", "sendrecv",
                      "probe")
    for name in (base, base.capitalize())) | {"Wait", "Waitall", "Waitany"}
MPI_ROOM = "hpckit/run/mpi/"

# The storage layer's calls that change a file or directory.
STORAGE_WRITES = frozenset({"write_bytes", "write_atomic", "append_text", "make_dir",
                            "delete_dir", "delete_file", "persist_file", "copy_file",
                            "fsync_tree", "download_dir"})
# Who may call them, and for what (docs/architecture.md, "Who owns what").
WRITERS = {
    "hpckit/storage/": "the storage layer itself",
    "hpckit/experiment/": "the experiment directory's owner and its helpers",
    "hpckit/run/writing/shares.py": "each rank's files inside a pending checkpoint",
    "hpckit/run/writing/writer.py": "a node leader's files of a pending checkpoint: its ranks' "
                                    "resume states and its part of the records",
    "hpckit/run/levels/levels.py": "a cached checkpoint's files, copied to storage_path "
                                   "before rank 0 records them there",
    "hpckit/checkpoint.py": "Checkpoint.set_metadata and to_directory, the user's own calls",
    "hpckit/sweep/record.py": "sweep.json, the sweep directory's (not an experiment's)",
    "hpckit/sweep/exploit.py": "PBT's copy of a donor's checkpoint into the trial's next "
                               "checkpoint directory, before the trial's Experiment commits it",
    "hpckit/doctor.py": "hpckit doctor's marker at the storage root, removed at once",
}

# On the ranks, local files are written only by these rooms, each in a directory of its own:
# staging and in-place checkpoint directories (writing), node-local caches (levels, and the
# partner copies that run.mpi.transfer receives), shared memory (startup), the error
# payload for the launching process (ending.exit), and what a process that re-runs the
# user's script reads (job; validation, on rank 0).
LOCAL_WRITES = frozenset({"makedirs", "mkdir", "rename", "replace", "unlink", "remove", "rmdir",
                          "rmtree", "copyfile", "copy2", "copytree", "move", "link"})
RUN_ROOM = "hpckit/run/"
LOCAL_WRITERS = {
    "hpckit/run/writing/staging.py": "staging directories and in-place checkpoint directories",
    "hpckit/run/writing/shares.py": "each rank's files linked into a pending checkpoint",
    "hpckit/run/levels/levels.py": "a node's checkpoint cache",
    "hpckit/run/levels/restore.py": "a checkpoint assembled in a node's cache for a restart",
    "hpckit/run/mpi/transfer.py": "partner copies received into a node's cache",
    "hpckit/run/startup/shm.py": "shared memory left by a killed incarnation",
    "hpckit/run/ending/exit.py": "a failed rank's error, for the process that launched it",
    "hpckit/run/job.py": "the payload of a process that re-runs the user's script",
    "hpckit/run/validation/child.py": "the validation payload and answer folders, on rank 0's "
                                      "node or on a rank set aside",
}


def _calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every call of an attribute or a plain name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name:
                found.append((node.lineno, name))
    return found


def blocking_collectives(source: str) -> list[tuple[int, str]]:
    """Method calls (``comm.bcast(...)``) of the names above."""
    return [(node.lineno, node.func.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in COLLECTIVES]


def storage_writes(source: str) -> list[tuple[int, str]]:
    return [(line, name) for line, name in _calls(ast.parse(source)) if name in STORAGE_WRITES]


def local_writes(source: str) -> list[tuple[int, str]]:
    """Calls of ``os.X`` and ``shutil.X`` that change files."""
    return [(node.lineno, node.func.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in ("os", "shutil")
            and node.func.attr in LOCAL_WRITES]


def _modules() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))]


def test_ranks_wait_for_each_other_only_through_the_mpi_room():
    outside = [f"{module}:{line} {name}()" for module, source in _modules()
               if not module.startswith(MPI_ROOM)
               for line, name in blocking_collectives(source)]
    assert outside == [], (
        "a blocking MPI call outside hpckit/run/mpi/ (Ctrl-C cannot reach a rank waiting in "
        f"it): {outside}; use run.mpi.waiting (from_root, share, wait_for_all, send_to, "
        "receive_from) or run.mpi.comm's collective steps")


def test_only_the_experiment_and_named_owners_write_to_storage():
    others = [f"{module}:{line} {name}()" for module, source in _modules()
              if not any(module.startswith(owner) for owner in WRITERS)
              for line, name in storage_writes(source)]
    assert others == [], (
        f"a storage write outside the experiment directory's owners: {others}; add a method "
        "to Experiment (or, for files no experiment owns, name the module in WRITERS and in "
        "docs/architecture.md)")


def test_on_the_ranks_local_files_change_only_in_the_named_rooms():
    others = [f"{module}:{line} {name}()" for module, source in _modules()
              if module.startswith(RUN_ROOM) and module not in LOCAL_WRITERS
              for line, name in local_writes(source)]
    assert others == [], (
        f"a file changed on a rank outside the rooms that own local files: {others}; move it "
        "into the room that owns that directory (e.g. writing.staging.Staging for staging)")


def test_every_named_owner_exists():
    missing = [path for path in [*WRITERS, *LOCAL_WRITERS] if not (ROOT / path).exists()]
    assert missing == [], f"owners named in this test that no longer exist: {missing}"


PLANTED = '''
def end(comm, location):
    comm.barrier()
    answer = comm.recv(source=0, tag=1)
    comm.Allreduce(buffer, result)
    files.delete_dir(location)
    write_atomic(location, b"")
    shutil.rmtree(staged)
'''


def test_both_checks_find_a_planted_violation():
    assert [name for _, name in blocking_collectives(PLANTED)] == ["barrier", "recv", "Allreduce"]
    assert [name for _, name in storage_writes(PLANTED)] == ["delete_dir", "write_atomic"]
    assert [name for _, name in local_writes(PLANTED)] == ["rmtree"]


def test_no_assert_guards_hpckit_state():
    """``python -O`` removes asserts: a protocol check must be an error that names what
    diverged (hpckit.errors.ProtocolError)."""
    found = [f"{module}:{node.lineno}" for module, source in _modules()
             for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assert)]
    assert found == [], f"assert statements in hpckit: {found}"


def exit_statuses(source: str) -> list[tuple[int, str]]:
    """Exit statuses written as numbers (other than 0 and 1) where a process ends or one is
    compared, and names ``EXIT_*`` defined: each belongs in hpckit/exits.py."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in node.targets):
            found.append((node.lineno, node.targets[0].id))  # type: ignore[attr-defined]
        elif isinstance(node, ast.Call) and _called(node) in ("SystemExit", "_exit", "exit"):
            found += [(node.lineno, str(a.value)) for a in node.args
                      if isinstance(a, ast.Constant) and a.value not in (0, 1)]
        elif isinstance(node, ast.Compare):
            found += [(node.lineno, str(c.value)) for c in node.comparators
                      if isinstance(c, ast.Constant) and c.value in (75, 77, 124, 130, 143)]
    return found


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def test_every_exit_status_is_defined_in_the_one_table():
    """#54: one table of exit statuses (hpckit/exits.py), which every retry loop reads."""
    found = [f"{module}:{line} {what}" for module, source in _modules()
             if module != "hpckit/exits.py" for line, what in exit_statuses(source)]
    assert found == [], f"exit statuses outside hpckit/exits.py: {found}"
    planted = "EXIT_DONE = 5\nraise SystemExit(75)\nos._exit(124)\nif code == 77:\n    pass\n"
    assert [what for _, what in exit_statuses(planted)] == ["EXIT_DONE", "75", "124", "77"]
