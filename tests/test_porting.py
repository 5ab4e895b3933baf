"""docs/porting.md: each Ray program on the page, with the page's diff applied, runs under
hpckit as the page says. The diff must apply to the program exactly as shown (its context
and removed lines in place), so neither can drift from the other."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from conftest import run
from support.doc_snippets import ROOT, Block, blocks

PAGE = ROOT / "docs" / "porting.md"
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def applied(program: str, diff: str) -> str:
    """``program`` with the unified ``diff`` applied; every line it keeps or removes must be
    where the hunk says."""
    lines = program.splitlines(keepends=True)
    out: list[str] = []
    at = 0
    hunk_lines = diff.splitlines(keepends=True)[2:]  # after the ---/+++ header
    for line in hunk_lines:
        hunk = HUNK.match(line)
        if hunk:
            start = int(hunk.group(1)) - 1
            assert start >= at, f"hunk out of order: {line}"
            out += lines[at:start]
            at = start
        elif line.startswith((" ", "-")):
            assert lines[at] == line[1:], f"line {at + 1} is {lines[at]!r}, the diff says {line!r}"
            if line.startswith(" "):
                out.append(lines[at])
            at += 1
        elif line.startswith("+"):
            out.append(line[1:])
    return "".join(out + lines[at:])


def ported(section: int) -> str:
    """The hpckit program of the page's ``section``-th (program, diff) pair."""
    shown: list[Block] = [b for b in blocks(PAGE) if b.language in ("python", "diff")]
    program, diff = shown[2 * section], shown[2 * section + 1]
    assert (program.language, diff.language) == ("python", "diff"), (program.id, diff.id)
    port = applied(program.text, diff.text)
    assert re.search(r"\bray\b", program.text) and not re.search(r"\bray\b", port), \
        "the port leaves a Ray import, or the program shown has none"
    return port


def test_the_ray_train_program_with_the_diff_trains_with_hpckit(tmp_path):
    """Two ranks, a checkpoint an epoch, its FailureConfig kept. (That a named experiment
    resumes when run again is the README example's test, tests/test_examples.py.)"""
    script = tmp_path / "train.py"
    script.write_text(ported(0))
    run([sys.executable, str(script)], timeout=180, cwd=tmp_path,
        env={"HOME": str(tmp_path), "HPCKIT_STORAGE": ""})
    experiment = tmp_path / "results" / "linear"
    manifest = json.loads((experiment / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["latest"] == "checkpoint_000002"
    assert manifest["config"]["failure_config"]["max_failures"] == 3


def test_the_ray_tune_program_with_the_diff_runs_its_trials_with_hpckit(tmp_path):
    script = tmp_path / "tune.py"
    script.write_text(ported(1))
    out = run([sys.executable, str(script)], timeout=180, cwd=tmp_path,
              env={"HOME": str(tmp_path), "HPCKIT_STORAGE": ""})
    sweep = tmp_path / "results" / "search"
    trials = json.loads((sweep / "sweep.json").read_text())["trials"]
    assert len(trials) == 4 and {t["status"] for t in trials} == {"TERMINATED"}, trials
    best = out.output.strip().splitlines()[-1]
    assert best.startswith("{'lr': ") and "'width': " in best, out.output


def test_a_diff_that_does_not_fit_the_program_is_refused():
    try:
        applied("a\nb\n", "--- x\n+++ y\n@@ -1,1 +1,1 @@\n-c\n+d\n")
    except AssertionError as refused:
        assert "line 1 is 'a\\n', the diff says '-c\\n'" in str(refused)
    else:
        raise AssertionError("a diff whose removed line is not there was applied")
