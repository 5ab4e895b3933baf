"""The structure stays as docs/architecture.md draws it: the import-linter contracts hold, no
module imports itself through others, a long module or function is read and its reason
written down, and importing hpckit never fails whatever the environment holds. No test
module imports another."""

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
# A module or function this long is a question for review, never a reason to split it
# (docs/architecture.md): each one past these lengths is named in READ, with why it stays.
REVIEW_MODULE_LINES, REVIEW_FUNCTION_LINES = 500, 80
READ: dict[str, str] = {
    "hpckit/run/commit/coordinator.py": "rank 0's decisions in one room (#68): each step's "
                                        "plan, the commits in report order, the background "
                                        "commits and the callbacks they tell",
    "hpckit/sweep/legacy.py:run": "Ray's tune.run: 23 keywords, each in its Args: (#68); the "
                                  "body, 39 lines, turns each into its Tuner form in one place",
}


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
    graph.add_import(importer="hpckit.storage.files", imported="hpckit.experiment.experiment")
    assert any("hpckit.storage.files" in cycle for cycle in _cycles(graph))


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _long(module_lines: int = REVIEW_MODULE_LINES,
          function_lines: int = REVIEW_FUNCTION_LINES) -> dict[str, int]:
    """Every module and function past the review lengths, with its length."""
    found = {}
    for path in _sources():
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        if (lines := len(text.splitlines())) > module_lines:
            found[name] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > function_lines:
                    found[f"{name}:{node.name}"] = length
    return found


def test_a_long_module_or_function_is_read_and_its_reason_written_down():
    """The list to read in review: what is past the lengths and not yet in READ (add it
    there with why it stays whole, or split it where it holds two ideas), and what READ names
    that is no longer long (take it out)."""
    long = _long()
    unread = {name: lines for name, lines in long.items() if name not in READ}
    stale = sorted(set(READ) - set(long))
    assert not unread and not stale, (
        f"past {REVIEW_MODULE_LINES} lines a module or {REVIEW_FUNCTION_LINES} a function, "
        f"not in READ: {unread}; in READ, no longer long: {stale}")


def test_the_review_list_finds_what_is_long():
    long = _long(module_lines=200, function_lines=40)
    assert any(":" not in name for name in long) and any(":" in name for name in long), long


# Exceptions defined outside errors.py, each with why: signals that are not errors (they
# derive from BaseException so that no ``except Exception`` of the user's catches them), and
# click's own exception types, which the CLI layer raises to click.
EXCEPTIONS_ELSEWHERE = {
    "hpckit/run/ending/stop.py:StopRequested": "a stop the ranks agreed on, not an error",
    "hpckit/run/ending/stop.py:CriterionMet": "RunConfig(stop=...) met, not an error",
    "hpckit/launch/mainimport.py:MainImported": "the user's script stopped at its fit()",
    "hpckit/cli/app.py:CommandError": "click's ClickException, what click prints",
    "hpckit/cli/app.py:_UsageFailure": "click's ClickException, what click prints",
    "hpckit/cli/app.py:_StorageFailure": "click's ClickException, what click prints",
}
EXCEPTION_BASES = {"Exception", "BaseException", "ValueError", "RuntimeError", "OSError",
                   "ClickException", "KeyError", "TypeError", "LookupError"}


def _exception_classes(source: str, path: str) -> list[str]:
    """``path:Name`` of every class in ``source`` that derives from an exception: a built-in
    one, or a class whose name ends in Error, Exception or Failure (hpckit's own)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                     for b in node.bases]
            if any(b in EXCEPTION_BASES or b.endswith(("Error", "Exception", "Failure"))
                   for b in bases):
                found.append(f"{path}:{node.name}")
    return found


def test_every_exception_is_in_errors_py():
    """#68: one hierarchy in one module, so a reader finds every error hpckit raises there;
    what stays elsewhere says why (EXCEPTIONS_ELSEWHERE)."""
    found = [name for path in _sources() if path.name != "errors.py" or path.parent != PACKAGE
             for name in _exception_classes(path.read_text(), str(path.relative_to(ROOT)))]
    unexplained = sorted(set(found) - set(EXCEPTIONS_ELSEWHERE))
    assert not unexplained, f"exceptions outside hpckit/errors.py: {unexplained}"
    stale = sorted(set(EXCEPTIONS_ELSEWHERE) - set(found))
    assert not stale, f"EXCEPTIONS_ELSEWHERE names classes that are gone: {stale}"


def test_the_exception_check_finds_a_planted_one():
    planted = "class Lost(HpckitError):\n    pass\nclass Halted(RuntimeError):\n    pass\n"
    assert _exception_classes(planted, "x.py") == ["x.py:Lost", "x.py:Halted"]


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
