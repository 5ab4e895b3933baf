"""The fenced blocks of README.md and docs/*.md, and the commands, options, environment
variables and Python names the pages mention: parsed and checked here, run by
tests/test_doc_snippets.py.

A block is run or checked by the harness, or the line right above its fence says why not:

    <!-- not run: REASON -->             never run (sample output, a diagram, a cluster's paths)
    <!-- tested by: tests/FILE.py -->     another test runs it (that file must name the page)
    <!-- run with: COMPLETION -->         run after the named completion in test_doc_snippets.py
    <!-- sample: REASON -->               a console block run, its output an example (REASON)

A ``console`` block's commands run, and what each prints is compared with the output the
page shows under it (:func:`transcript_problem`: times, checksums, decimals and paths
normalised), unless the block is marked a sample.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import click

ROOT = Path(__file__).parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Generated from the commands' --help; tests/test_cli_reference.py keeps it equal to them.
GENERATED = ROOT / "docs" / "cli.md"

MARKER = re.compile(r"^<!--\s*(not run|tested by|run with|sample):\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w-]*)")
SHELLS = {"bash", "console", "sh"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, counted from 1
    language: str
    text: str
    marker: tuple[str, str] | None  # (kind, argument) of the comment above the fence

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_sbatch(self) -> bool:
        return self.language in SHELLS and "#SBATCH" in self.text


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith(opening.group(1)):
            end += 1
        above = MARKER.match(lines[index - 1].strip()) if index else None
        found.append(Block(page, index + 1, opening.group(2), "\n".join(lines[index + 1:end]) + "\n",
                           (above.group(1), above.group(2)) if above else None))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def code_texts(page: Path) -> list[str]:
    """What a page shows as code: its fenced blocks and its inline `spans`."""
    prose = re.sub(r"^(```+|~~~+).*?^\1", "", page.read_text(), flags=re.M | re.S)
    return [block.text for block in blocks(page)] + re.findall(r"`([^`\n]+)`", prose)


# --- console transcripts -------------------------------------------------------------------

ELIDED = "..."
NORMALISED = [
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?"), "<time>"),
    (re.compile(r"(?<![\w.])-?\d+\.\d+(e-?\d+)?"), "<decimal>"),
    (re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b(\.\.\.)?"), "<hex>"),
    (re.compile(r"[ \t]+"), " "),
]


def transcript(block: Block) -> list[tuple[str, list[str]]]:
    """A console block's commands, each with the lines the page shows it printing (``echo
    $?`` is not one: it names the exit status the harness checks)."""
    found: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        elif found:
            found[-1][1].append(line)
    return [(command, shown) for command, shown in found if command != "echo $?"]


def normalised(text: str, paths: dict[str, str]) -> list[str]:
    """The lines of ``text`` with what differs from run to run replaced: this machine's paths
    by the page's, date-times, checksums, and decimals (losses, durations, sizes) by
    placeholders, runs of blanks (column widths) by one."""
    for here, shown in sorted(paths.items(), key=lambda item: -len(item[0])):
        text = text.replace(here, shown)
    lines = []
    for line in text.splitlines():
        for pattern, placeholder in NORMALISED:
            line = pattern.sub(placeholder, line)
        lines.append(line.strip())
    return [line for line in lines if line]


def transcript_problem(shown: list[str], printed: list[str]) -> str | None:
    """Where ``printed`` differs from the lines ``shown`` (both normalised); a shown ``...``
    stands for any lines, none included. Nothing shown is nothing to compare."""
    if not shown or _matches(shown, printed):
        return None
    return _difference(shown, printed)


def _matches(shown: list[str], printed: list[str]) -> bool:
    """Whether ``printed`` is ``shown`` with each ``...`` standing for any lines: a match of
    line positions, each pair of positions tried once."""
    @functools.cache
    def from_(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(printed)
        if shown[i] == ELIDED:
            return from_(i + 1, j) or (j < len(printed) and from_(i, j + 1))
        return j < len(printed) and shown[i] == printed[j] and from_(i + 1, j + 1)
    return from_(0, 0)


def _difference(shown: list[str], printed: list[str]) -> str:
    return ("the page shows:\n  " + "\n  ".join(shown) + "\nthe command printed:\n  "
            + "\n  ".join(printed))


# --- hpckit commands and their options ------------------------------------------------------

COMMAND = re.compile(r"(?<![\w.-])hpckit[ \t]+([^\n#;|&)`]*)")
# "an hpckit experiment", "the hpckit command": nouns after the word in diagrams and layouts.
NOUNS = {"experiment", "experiments", "command"}


def hpckit_invocations(code: str) -> list[list[str]]:
    """The words after each ``hpckit`` (or ``python -m hpckit``) in a piece of code, up to a
    comment, a pipe or the end of the command."""
    found, code = [], code.replace("\\\n", " ")
    for match in COMMAND.finditer(code):
        line_before = code[code.rfind("\n", 0, match.start()) + 1:match.start()]
        if "#" in line_before or re.search(r"(from|import)[ \t]+$", line_before):
            continue  # a comment's prose, or the package imported
        words = match.group(1).split()
        if words and re.fullmatch(r"[a-z][a-z-]*", words[0]) and words[0] not in NOUNS:
            found.append(words)
    return found


def cli_problems(words: list[str], group: click.Group) -> list[str]:
    """What in ``hpckit WORDS`` the command line interface lacks: the command, or an option."""
    command = group.commands.get(words[0])
    if command is None:
        return [f"no command `hpckit {words[0]}` (the commands: {', '.join(sorted(group.commands))})"]
    options = {name: param for param in command.params if isinstance(param, click.Option)
               for name in (*param.opts, *param.secondary_opts)}
    options["--help"] = None  # type: ignore[assignment]
    problems, rest = [], iter(words[1:])
    for word in rest:
        if re.fullmatch(r"-[A-Za-z]\S*|--[a-z][\w-]*(=.*)?", word):
            name = word.split("=", 1)[0]
            if name not in options:
                problems.append(f"no option `{name}` of `hpckit {words[0]}`")
            elif options[name] is not None and not options[name].is_flag and "=" not in word:
                next(rest, None)
        elif not command.context_settings.get("allow_interspersed_args", True):
            break  # the script's own arguments follow (hpckit run, hpckit sweep)
    return problems


# --- environment variables -----------------------------------------------------------------

ENV_NAME = re.compile(r"\bHPCKIT_[A-Z0-9_]*[A-Z0-9]\b")
# Read by the installer and the fault-injection suite, not by the package.
READ_OUTSIDE_THE_PACKAGE = {"HPCKIT_TORCH_INDEX": ".ci/install",
                            "HPCKIT_RELIABILITY_LOG": "tests/support/reliability.py",
                            "HPCKIT_KILL_TRIALS": "tests/test_kill.py"}


def package_text() -> str:
    return "\n".join(path.read_text(errors="replace") for path in sorted((ROOT / "hpckit").rglob("*"))
                     if path.is_file() and path.suffix in {".py", ".pth"})


def unread_env_names(names: set[str], source: str) -> list[str]:
    unread = []
    for name in sorted(names):
        reader = READ_OUTSIDE_THE_PACKAGE.get(name)
        text = (ROOT / reader).read_text() if reader else source
        if not re.search(rf"\b{name}\b", text):
            unread.append(f"`{name}` is read nowhere in {reader or 'hpckit/'}")
    return unread


# --- Python names --------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w\"'./-])hpckit(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"\bfrom[ \t]+(hpckit(?:\.\w+)*)[ \t]+import[ \t]+(?:\(([^)]*)\)|([\w, \t]+))")


def python_names(code: str) -> set[str]:
    """``hpckit.a.b`` and every ``from hpckit.a import b, c`` as ``hpckit.a.b``, ``hpckit.a.c``."""
    names = set(DOTTED.findall(code))
    for module, parenthesised, imported in FROM_IMPORT.findall(code):
        imported = parenthesised or imported
        names.update(f"{module}.{name.strip()}" for name in imported.split(",") if name.strip())
    return names


def unresolved(name: str) -> str | None:
    """Why ``name`` cannot be imported or looked up, or None."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for index, attribute in enumerate(parts[split:], split):
            if not hasattr(found, attribute):
                return f"`{name}`: {'.'.join(parts[:index])} has no `{attribute}`"
            found = getattr(found, attribute)
        return None
    return f"`{name}`: no module {parts[0]}"


# --- example scripts named with options ----------------------------------------------------

EXAMPLE_RUN = re.compile(r"(examples/\w+\.py)((?:[ \t]+[^\s#;|&]+)*)")


def example_option_problems(code: str) -> list[str]:
    """Options passed to a script of examples/ that its argument parser does not define."""
    problems = []
    for script, arguments in EXAMPLE_RUN.findall(code.replace("\\\n", " ")):
        source = (ROOT / script).read_text() if (ROOT / script).exists() else None
        if source is None:
            problems.append(f"no script {script}")
            continue
        for option in re.findall(r"(?<!\S)(--[a-z][\w-]*)", arguments):
            if f'"{option}"' not in source:
                problems.append(f"{script} has no option {option}")
    return problems


# --- sbatch scripts ------------------------------------------------------------------------

def sbatch_problems(script: str, cpu_only: bool) -> list[str]:
    """What a job script gets wrong in the ways hpckit's templates (slurm/*.sbatch) get right."""
    directives = re.findall(r"^#SBATCH[ \t]+(\S+)", script, flags=re.M)
    commands = "\n".join(line.split("#", 1)[0] for line in script.splitlines()).replace("\\\n", " ")
    problems = []
    sruns = re.findall(r"(?<![\w-])srun\b[^\n]*", commands)
    problems += [f"srun without --mpi= (the PMI of mpi4py's MPI; the templates ask "
                 f"hpckit doctor --srun-mpi): {srun.strip()[:60]}" for srun in sruns if "--mpi=" not in srun]
    for directive in directives:
        warned = re.fullmatch(r"--signal=B:(?:SIG)?(\w+)(@\d+)?", directive)
        if warned:
            problems += _forwarding_problems(warned.group(1), commands, sruns)
        if cpu_only and re.match(r"--(gres=gpu|gpus)", directive):
            problems.append(f"{directive} asks for GPUs for a CPU example")
    return problems


def _forwarding_problems(signal: str, commands: str, sruns: list[str]) -> list[str]:
    """``--signal=B:`` warns the batch shell alone, whose default is to die of the signal: it
    must trap it and pass it on to the ranks, as requeue.sbatch does, or ``exec`` the program
    that starts them (``exec python train.py``, multi-node.sbatch), which is then warned
    itself."""
    problems = []
    warned_itself = not sruns and re.search(r"^\s*exec\s+\S", commands, flags=re.M)
    if not warned_itself and not re.search(rf"^\s*trap\b[^\n]*\b(SIG)?{signal}\b", commands, flags=re.M):
        problems.append(f"--signal=B:{signal} but no `trap ... {signal}`: the warning kills the batch shell")
    if sruns and not re.search(rf"\bkill\s+-(SIG)?{signal}\b", commands):
        problems.append(f"--signal=B:{signal} but the ranks are never sent {signal} (`kill -{signal}` "
                        "the backgrounded srun)")
    if sruns and not any(srun.rstrip().endswith("&") for srun in sruns):
        problems.append("srun runs in the foreground: the batch shell cannot trap the warning until it ends")
    if signal != "USR2" and not re.search(rf"HPCKIT_STOP_SIGNAL=(SIG)?{signal}\b", commands):
        problems.append(f"--signal=B:{signal} but HPCKIT_STOP_SIGNAL is not {signal}")
    return problems


def parses_as_json(text: str) -> bool:
    """A record, or a record's ``"key": value`` member on its own."""
    for candidate in (text, "{" + text + "}"):
        try:
            json.loads(candidate)
            return True
        except json.JSONDecodeError:
            continue
    return False
