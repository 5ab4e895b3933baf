"""Every relative link in README.md and docs/ reaches a file that exists, and every #anchor a
heading of its page, as GitHub renders both (a renamed heading or page breaks no link
silently). Pure: no MPI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick
ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower-cased, punctuation
    dropped but hyphens and underscores, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if heading := re.match(r"#{1,6} (.+)", line):
            base = slug(heading[1])
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_reach_a_file_and_a_heading(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {where.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_slug_is_githubs():
    assert slug("The protocol at scale (issue #40)") == "the-protocol-at-scale-issue-40"
    assert slug("`FailureConfig(hang_timeout_s=S)`: a run that stops making progress") == \
        "failureconfighang_timeout_ss-a-run-that-stops-making-progress"
