"""docs/environment.md stays true: it lists every variable of hpckit.settings.TABLE, and every
HPCKIT_* name it mentions exists (in TABLE, or somewhere in hpckit/'s source), so the page
names no variable that hpckit would ignore."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpckit.settings import TABLE

pytestmark = pytest.mark.quick

ROOT = Path(__file__).parent.parent
PAGE = ROOT / "docs" / "environment.md"
NAME = re.compile(r"\bHPCKIT_[A-Z_]+[A-Z]\b")


def _source() -> str:
    """Every file of the package hpckit reads its variables in (the start-up hook is a .pth)."""
    return "\n".join(path.read_text(errors="replace") for path in sorted((ROOT / "hpckit").rglob("*"))
                     if path.is_file() and path.suffix in {".py", ".pth"})


def test_every_variable_of_the_settings_table_is_on_the_page():
    page = PAGE.read_text()
    missing = [variable for variable, _ in TABLE.values() if f"`{variable}`" not in page]
    assert not missing, f"docs/environment.md does not list {', '.join(missing)} (in backticks)"


def test_every_hpckit_variable_on_the_page_exists():
    known = {variable for variable, _ in TABLE.values()}
    source = _source()
    unknown = sorted(name for name in set(NAME.findall(PAGE.read_text()))
                     if name not in known and not re.search(rf"\b{name}\b", source))
    assert not unknown, f"docs/environment.md names {', '.join(unknown)}, read nowhere in hpckit/"


def test_the_check_finds_a_name_that_does_not_exist():
    """The check above cannot pass by finding nothing."""
    assert NAME.findall("set `HPCKIT_NO_SUCH_VARIABLE=1`") == ["HPCKIT_NO_SUCH_VARIABLE"]
    assert not re.search(r"\bHPCKIT_NO_SUCH_VARIABLE\b", _source())
