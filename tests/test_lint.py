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
