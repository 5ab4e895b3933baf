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
