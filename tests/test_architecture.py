"""The structure stays as docs/architecture.md draws it: the import-linter contracts hold, no
module imports itself through others, modules and functions stay small, and importing hpckit
never fails whatever the environment holds. No test module imports another."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from hpckit.settings import TABLE

pytestmark = pytest.mark.quick

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "hpckit"
TESTS = ROOT / "tests"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 300, 50


def test_the_layer_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "0 broken" in out.stdout, out.stdout + out.stderr


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles():
    graph = grimp.build_graph("hpckit")
    for imported in graph.find_modules_directly_imported_by("hpckit"):
        graph.remove_import(importer="hpckit", imported=imported)  # the public face re-exports
    assert len(graph.modules) > 150  # before, removing the package removed every module
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    graph = grimp.build_graph("hpckit")
    graph.add_import(importer="hpckit.storage.files", imported="hpckit.experiment.manifest")
    assert any("hpckit.storage.files" in cycle for cycle in _cycles(graph))


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_modules_are_small():
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_functions_are_small():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_tests_folder_holds_test_modules_and_their_helpers_live_in_support():
    """#54: beside the test modules only conftest.py; every helper module in tests/support/,
    imported as ``support.X`` (never as a top-level name that could shadow a package's)."""
    loose = sorted(p.name for p in TESTS.glob("*.py")
                   if not p.name.startswith("test_") and p.name != "conftest.py")
    assert loose == [], f"helper modules outside tests/support/: {loose}"
    helpers = {p.stem for p in (TESTS / "support").glob("*.py")} - {"__init__"}
    assert len(helpers) > 5, f"only {sorted(helpers)} in tests/support/"
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     and node.module else [])
            found += [f"{path.relative_to(TESTS)}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] in helpers]
    assert found == [], f"helpers imported by their bare name, not as support.X: {found}"


def test_no_test_module_imports_another():
    """What two test modules share lives in a helper module (conftest.py, or one of
    tests/support/), never in a test module that another imports."""
    found = []
    modules = sorted(TESTS.glob("test_*.py"))
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{path.name}:{node.lineno} imports {name}" for name in names
                      if name.split(".")[0].startswith("test_")]
    assert len(modules) > 50, f"only {len(modules)} test modules found in {TESTS}"
    assert found == [], found


def test_importing_hpckit_never_fails_whatever_the_environment():
    bad = {variable: "\x01not-valid:" for variable, _ in TABLE.values()}
    code = "import hpckit, hpckit.torch, hpckit.cli; print('imported')"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **bad},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "imported" in out.stdout, out.stderr


@pytest.mark.parametrize("variable,value,accepted", [
    ("HPCKIT_FAULT", "written:one:1", "PHASE:RANK:N"),
    ("HPCKIT_TENSORBOARD", "maybe", "one of 1, true"),
    ("HPCKIT_LOG_LEVEL", "LOUD", "DEBUG, INFO"),
    ("HPCKIT_INLINE_RECORDS", "many", "a whole number >= 0"),
    # #51, item 11: each was accepted, then crashed where it was used.
    ("HPCKIT_INLINE_RECORDS", "²", "a whole number >= 0"),
    ("HPCKIT_STOP_SIGNAL", "KILL", "a signal a process can catch"),
    ("HPCKIT_STOP_SIGNAL", "STOP", "a signal a process can catch"),
    ("HPCKIT_LOCK_STALE_SECONDS", "inf", "a number of seconds > 0 and at most a year"),
    ("HPCKIT_LOCK_STALE_SECONDS", "1e400", "a number of seconds > 0 and at most a year"),
    ("HPCKIT_LOCAL_DIR", "/nonexistent", "an existing directory"),
])
def test_a_bad_variable_is_one_line_naming_it_and_what_is_accepted(tmp_path, variable, value,
                                                                   accepted):
    hpckit = Path(sys.executable).parent / "hpckit"
    out = subprocess.run([str(hpckit), "ls", str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, variable: value}, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert f"{variable}={value!r} is invalid" in lines[0] and accepted in lines[0], lines
    assert "Traceback" not in out.stderr
