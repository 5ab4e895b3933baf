"""The package passes ruff and mypy with the configuration in pyproject.toml (part of the test
command, so CI runs them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).parent.parent


def test_ruff():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "hpckit", "examples"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy():
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_skips_no_module_that_hpckit_imports():
    """pyproject.toml has mypy skip what hpckit never imports of torch (and what optuna
    brings): a module hpckit imported from that list would be Any, its uses unchecked."""
    import ast
    import tomllib

    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    [unused] = [o["module"] for o in overrides if "torch.fx.*" in o["module"]]
    skipped = [pattern.removesuffix(".*") for pattern in unused]
    imported = set()
    for path in (ROOT / "hpckit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    found = sorted(name for name in imported for prefix in skipped
                   if name == prefix or name.startswith(prefix + "."))
    assert "torch.distributed.checkpoint" in imported and not found, found
