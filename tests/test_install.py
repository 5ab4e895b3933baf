"""The start-up hook (hpckit-early.pth) lands in the site-packages of the Python that installs
hpckit, for an editable install and a wheel alike, whatever that Python's version: setup.py's
rule is a pure function, and real installs here show it on this Python."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

import hpckit

ROOT = Path(__file__).parent.parent
HOOK = ROOT / "hpckit" / "run" / "startup" / "hpckit-early.pth"
HERE_RELATIVE = Path(sysconfig.get_paths()["purelib"]).relative_to(sysconfig.get_paths()["data"])


def setup_script() -> ModuleType:
    """setup.py as a module (its ``setup()`` runs only as a script)."""
    spec = importlib.util.spec_from_file_location("hpckit_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.quick
@pytest.mark.parametrize("purelib, data, expected", [
    ("/w/.venv/lib/python3.11/site-packages", "/w/.venv", "lib/python3.11/site-packages"),
    ("/w/.venv/lib/python3.12/site-packages", "/w/.venv", "lib/python3.12/site-packages"),
    ("/opt/py/lib/python3.13t/site-packages", "/opt/py", "lib/python3.13t/site-packages"),
    ("/usr/local/lib/python3.12/dist-packages", "/usr/local", "lib/python3.12/dist-packages"),
    ("/home/u/.local/lib/python3.12/site-packages", "/home/u/.local",
     "lib/python3.12/site-packages"),
])
def test_the_hook_goes_where_the_installing_python_reads_pth_files(purelib, data, expected):
    assert setup_script().hook_directory(purelib, data) == expected


def built(kind: str, into: Path) -> list[str]:
    """The files of the wheel that setuptools' build backend makes for ``pip install .``
    (``wheel``) or ``pip install -e .`` (``editable``), as pip would ask it to."""
    out = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                          f"print(build_meta.build_{kind}(sys.argv[1]))", str(into)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    with zipfile.ZipFile(into / out.stdout.strip().splitlines()[-1]) as archive:
        return archive.namelist()


@pytest.mark.parametrize("kind", ["editable", "wheel"])
def test_an_install_puts_the_hook_in_this_pythons_site_packages(tmp_path, kind):
    # pip puts a wheel's NAME.data/data/PATH files at PATH under the environment's prefix.
    data = f"hpckit-{hpckit.__version__}.data/data/{HERE_RELATIVE}/{HOOK.name}"
    assert data in built(kind, tmp_path)
