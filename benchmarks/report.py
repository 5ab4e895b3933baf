"""Render docs/performance.md and docs/scaling.md from their templates and the benchmarks'
recorded figures.

    python benchmarks/report.py            # write the pages
    python benchmarks/report.py --check    # exit 1 if a page is not what this renders

A template, benchmarks/performance.md.in or benchmarks/scaling.md.in, holds the prose; every
figure in it is a placeholder resolved from benchmarks/results/*.jsonl (written by
benchmarks/record.py):

    {{core figure=report_no_checkpoint ranks=2 median_ms:.2f}}

names a results file, selectors ``field=pattern`` (shell-style patterns, matched against the
field's text) that leave one line, or several that agree, and the field to show: a dotted path
(``report_ms.async``, ``by_ranks.0.median_ms``), then ``*1000`` to scale it and ``:.1f`` to
format it (``:met`` writes yes or **no**). ``{{run core}}`` says when, where and by which
command that file's figures were made; on a page with ``{{machines}}`` the machines are listed
there once and named "machine A", "machine B"... in the run lines. A placeholder no results
file answers is an error.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "performance.md.in"
RESULTS = HERE / "results"
PAGE = HERE.parent / "docs" / "performance.md"
PAGES = {TEMPLATE: PAGE, HERE / "scaling.md.in": HERE.parent / "docs" / "scaling.md"}
PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}", re.DOTALL)
FIELD = re.compile(r"^(?P<path>[^*:]+)(?:\*(?P<factor>[0-9.e+-]+))?(?::(?P<format>.*))?$")


class MissingFigure(LookupError):
    """A placeholder that no recorded figure answers (or that several answer differently)."""


def load(results: Path = RESULTS) -> dict[str, list[dict]]:
    """Every results file's lines, by the file's name without ``.jsonl``."""
    return {path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in sorted(results.glob("*.jsonl"))}


def render(template: str, recorded: dict[str, list[dict]]) -> str:
    machines = named_machines(template, recorded) if "{{machines}}" in template else {}
    return PLACEHOLDER.sub(lambda found: resolve(found.group(1), recorded, machines), template)


def named_machines(template: str, recorded: dict[str, list[dict]]) -> dict[str, str]:
    """Each machine the page's ``{{run NAME}}`` lines name, in order, as "machine A", "B"...:
    a page with ``{{machines}}`` lists them there once and names them so elsewhere."""
    found: dict[str, str] = {}
    for spec in PLACEHOLDER.findall(template):
        words = shlex.split(spec)
        if len(words) == 2 and words[0] == "run":
            for line in recorded.get(words[1], []):
                if "machine" in line and line["machine"] not in found:
                    found[line["machine"]] = f"machine {chr(ord('A') + len(found))}"
    return found


def resolve(spec: str, recorded: dict[str, list[dict]], machines: dict[str, str]) -> str:
    words = shlex.split(spec)
    if words == ["machines"]:
        return "\n".join(f"- **{name}**: {machine}" for machine, name in machines.items())
    if len(words) == 2 and words[0] == "run":
        return run_line(words[1], lines_of(words[1], recorded, spec), machines)
    if len(words) < 2:
        raise MissingFigure(f"{{{{{spec}}}}}: a placeholder is NAME [field=pattern ...] FIELD")
    name, *selectors, field = words
    chosen = [line for line in lines_of(name, recorded, spec) if matches(line, selectors)]
    parts = FIELD.match(field)
    if parts is None:
        raise MissingFigure(f"{{{{{spec}}}}}: {field!r} is not FIELD[*factor][:format]")
    values = {json.dumps(lookup(line, parts["path"])) for line in chosen} - {json.dumps(None)}
    if len(values) != 1:
        found = "no line has it" if not values else f"the lines disagree: {sorted(values)}"
        raise MissingFigure(f"{{{{{spec}}}}}: {len(chosen)} line(s) of results/{name}.jsonl "
                            f"match; {found}")
    return shown(json.loads(values.pop()), parts["factor"], parts["format"])


def lines_of(name: str, recorded: dict[str, list[dict]], spec: str) -> list[dict]:
    if name not in recorded:
        raise MissingFigure(f"{{{{{spec}}}}}: no benchmarks/results/{name}.jsonl "
                            f"(there are: {', '.join(recorded)})")
    return recorded[name]


def matches(line: dict, selectors: list[str]) -> bool:
    for selector in selectors:
        field, _, pattern = selector.partition("=")
        value = lookup(line, field)
        if value is None or not fnmatch.fnmatchcase(value if isinstance(value, str)
                                                    else json.dumps(value), pattern):
            return False
    return True


def lookup(line: object, path: str) -> object:
    """The value at a dotted path; a key may itself hold dots (``hpckit.torch``)."""
    if not path:
        return line
    parts = path.split(".")
    for taken in range(len(parts), 0, -1):
        key, rest = ".".join(parts[:taken]), ".".join(parts[taken:])
        if isinstance(line, dict) and key in line:
            return lookup(line[key], rest)
        if isinstance(line, list) and key.isdigit() and int(key) < len(line):
            return lookup(line[int(key)], rest)
    return None


def shown(value: object, factor: str | None, form: str | None) -> str:
    if form == "met":
        return "yes" if value else "**no**"
    if factor is not None:
        value = float(value) * float(factor)  # type: ignore[arg-type]
    return format(value, form) if form else str(value)


def run_line(name: str, lines: list[dict], machines: dict[str, str] | None = None) -> str:
    """'date, machine, command' of a results file, each once, as one sentence (the machine by
    its name where the page lists ``machines``)."""
    said = {}
    for field in ("date", "commit", "command", "machine", "label"):
        values = list(dict.fromkeys(str(line[field]) for line in lines if field in line))
        if field == "machine" and machines:
            values = [machines.get(value, value) for value in values]
        said[field] = " / ".join(values)
    at = f" at {said['commit']}" if said["commit"] else ""
    text = f"Recorded {said['date']}{at} by `{said['command']}` on {said['machine']}"
    return text + (f"; {said['label']}" if said["label"] else "") + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    recorded = load()
    for template, page in PAGES.items():
        try:
            text = render(template.read_text(), recorded)
        except MissingFigure as missing:
            sys.exit(f"benchmarks/{template.name}: {missing}")
        if not args.check:
            page.write_text(text)
        elif page.read_text() != text:
            sys.exit(f"docs/{page.name} is stale: python benchmarks/report.py")


if __name__ == "__main__":
    main()
