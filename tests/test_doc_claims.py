"""What the pages show a user to type agrees with what works: checks that fail on a page
that drifts back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_srun_that_starts_python_names_the_pmi():
    # A bare `srun python train.py` works only where the site's MpiDefault happens to be the
    # PMI that mpi4py's MPI speaks; elsewhere it starts N worlds of one rank each.
    bare = [f"{page.relative_to(ROOT)}: {match.group(0)}" for page in PAGES
            for match in re.finditer(r"`srun\b[^`]*\bpython[^`]*`", page.read_text())
            if "--mpi" not in match.group(0)]
    assert not bare, "srun without --mpi=pmi2|pmix:\n" + "\n".join(bare)


def test_the_torch_setup_cfg_allows_is_the_one_ci_runs_and_the_versions_table_names():
    # CI runs the lowest torch the versions table names, or the table names only what CI runs:
    # setup.cfg's floor, .ci/install's pin and docs/site.md's row agree.
    floor = re.search(r"^\s*torch>=([\d.]+)\s*$", (ROOT / "setup.cfg").read_text(), re.M)
    pinned = re.search(r"torch==([\d.]+)", (ROOT / ".ci" / "install").read_text())
    assert floor and pinned, "setup.cfg's torch>= or .ci/install's torch== is gone"
    assert pinned.group(1).startswith(floor.group(1) + "."), (floor.group(1), pinned.group(1))
    rows = [line for line in (ROOT / "docs" / "site.md").read_text().splitlines()
            if line.startswith("| torch |")]
    assert len(rows) == 1 and rows[0].startswith(
        f"| torch | {floor.group(1)} or later | {pinned.group(1)}, "), rows
