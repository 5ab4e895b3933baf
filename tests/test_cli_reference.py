"""docs/cli.md is generated from the commands' --help; this test keeps the two the same.

Regenerate after changing a command: python tests/test_cli_reference.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpckit.cli import main

pytestmark = pytest.mark.quick

PAGE = Path(__file__).parent.parent / "docs" / "cli.md"


def reference() -> str:
    runner = CliRunner()
    parts = ["# The `hpckit` command\n",
             "Generated from `hpckit --help` and each command's `--help` (kept in sync by "
             "`tests/test_cli_reference.py`).\n",
             "```\n" + runner.invoke(main, ["--help"], prog_name="hpckit", terminal_width=80).output + "```\n"]
    for name in sorted(main.commands):
        text = runner.invoke(main, [name, "--help"], prog_name="hpckit", terminal_width=80).output
        parts.append(f"## hpckit {name}\n\n```\n{text}```\n")
    return "\n".join(parts)


def test_the_reference_page_matches_the_commands():
    assert PAGE.read_text() == reference(), "docs/cli.md is stale: python tests/test_cli_reference.py"


if __name__ == "__main__":
    PAGE.write_text(reference())
