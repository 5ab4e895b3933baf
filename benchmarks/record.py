"""Run a benchmark and keep its figures as the page's source: benchmarks/results/NAME.jsonl.

    python benchmarks/record.py [--as NAME] [--label TEXT] [--commit REV] benchmarks/core.py --quick

The benchmark's output passes through. When it exits 0, every JSON line it printed (its
ranks' too) replaces the lines of NAME.jsonl, each with ``date``, ``commit`` (git's, or
``--commit`` where the tree is a copy without git), ``machine`` and ``command`` added (and
``label``, a word on the run's conditions, when given). NAME is the script's name, with
``-quick`` after it for a ``--quick`` run, so a quick run replaces only a quick run's
figures. Then ``python benchmarks/report.py`` renders docs/performance.md from them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_name(script: str, args: list[str]) -> str:
    return Path(script).stem + ("-quick" if "--quick" in args else "")


def machine() -> str:
    """Cores, CPU model, memory, OS, torch, and the GPUs nvidia-smi names, in one line."""
    parts = [f"{os.cpu_count()} cores ({_cpu_model()})",
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
             platform.freedesktop_os_release().get("PRETTY_NAME", platform.platform())]
    try:
        parts.append(f"torch {importlib.metadata.version('torch')}")
    except importlib.metadata.PackageNotFoundError:
        pass
    if shutil.which("nvidia-smi"):
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.split("\n")
        parts.extend(f"GPU {name.strip()}" for name in gpus if name.strip())
    return ", ".join(parts)


def commit() -> str:
    """HEAD's short hash, with ``+changes`` where tracked files differ from it."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=RESULTS.parent, capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD")
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+changes" if changed else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def figures(output: list[str]) -> list[dict]:
    """The JSON objects among the lines (ranks print ``BENCH {...}``; both count)."""
    found = []
    for line in output:
        text = line.split("BENCH ", 1)[1] if "BENCH " in line else line
        if text.startswith("{"):
            try:
                found.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    return found


def run(command: list[str]) -> tuple[int, list[str]]:
    """The benchmark's exit status and its stdout lines, echoed as they come."""
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line.rstrip("\n"))
    return process.returncode, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--as", dest="name", default=None, help="the results file's name")
    parser.add_argument("--label", default=None, help="the run's conditions, in a few words")
    parser.add_argument("--commit", default=None, help="the commit measured (default: git's)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    status, output = run([sys.executable, args.script, *args.args])
    if status != 0:
        sys.exit(f"{args.script} exited {status}: nothing recorded")
    run_fields = {"date": datetime.date.today().isoformat(), "commit": args.commit or commit(),
                  "machine": machine(),
                  "command": " ".join(["python", args.script, *args.args])}
    if args.label:
        run_fields["label"] = args.label
    lines = [{**figure, **run_fields} for figure in figures(output)]
    if not lines:
        sys.exit(f"{args.script} printed no JSON lines: nothing recorded")
    path = RESULTS / f"{args.name or results_name(args.script, args.args)}.jsonl"
    RESULTS.mkdir(exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(json.dumps(line) + "\n" for line in lines))
    temporary.replace(path)
    print(f"recorded {len(lines)} figures in {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
