"""Every parameter of the public API is documented where a reader looks for it (#68): in a
Google-style ``Args:`` section, as Ray Train, torchtitan and NVIDIA's resiliency extension
document theirs.

The rule, for every function and class in a public module's ``__all__``:

- a function documents each of its parameters in its own docstring;
- a class documents its constructor's parameters (a dataclass's fields) in the docstring of
  the class that defines ``__init__``, where that ``__init__`` is hpckit's: an exception or
  enum that keeps the built-in constructor, and a Protocol, take nothing to document;
- every public method of each hpckit class in its MRO is documented where it is first
  defined: an override is documented by the method it overrides, hpckit's (a scheduler's
  ``on_trial_result``, by ``TrialScheduler``'s) or a framework's (Lightning's hooks).

A parameter is named as written, ``*args`` and ``**kwargs`` with their stars; ``self``,
``cls`` and private parameters (a leading underscore, as ``Result``'s
``_storage_filesystem``) are not named. An optional integration's module is checked where
its extra is installed.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

pytestmark = pytest.mark.quick

# Each public module, with the package its extra brings (None: installed with hpckit).
PUBLIC = {
    "hpckit": None,
    "hpckit.torch": None,
    "hpckit.tune": None,
    "hpckit.tune.schedulers": None,
    "hpckit.tune.search": None,
    "hpckit.tune.search.optuna": "optuna",
    "hpckit.lightning": "lightning",
    "hpckit.transformers": "transformers",
    "hpckit.mlflow": "mlflow",
    "hpckit.wandb": "wandb",
}
ENTRY = re.compile(r"\s*(\*{0,2}\w+)(?: \([^)]*\))?:")


def _documented(docstring: str | None) -> set[str]:
    """The names that the ``Args:`` sections of ``docstring`` give an entry."""
    lines = inspect.cleandoc(docstring or "").splitlines()
    names = set()
    for at, line in enumerate(lines):
        if line.strip() != "Args:":
            continue
        indent = len(line) - len(line.lstrip())
        for entry in lines[at + 1:]:
            if entry.strip() and len(entry) - len(entry.lstrip()) <= indent:
                break
            if found := ENTRY.match(entry):
                names.add(found.group(1))
    return names


def _parameters(function: Callable[..., Any]) -> list[str]:
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name
            for p in inspect.signature(function).parameters.values()
            if p.name not in ("self", "cls") and not p.name.startswith("_")]


def _in(package: str, thing: object) -> bool:
    return (getattr(thing, "__module__", None) or "").split(".")[0] == package


def _methods(klass: type) -> list[tuple[str, Callable[..., Any]]]:
    """The public methods ``klass`` defines first (overriding none of a base's)."""
    found = []
    for name, member in vars(klass).items():
        function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        if (not name.startswith("_") and inspect.isfunction(function)
                and not any(name in vars(base) for base in klass.__mro__[1:])):
            found.append((name, function))
    return found


def _undocumented(thing: object, package: str = "hpckit") -> dict[str, list[str]]:
    """Each function, constructor (``Name()``) and method of ``thing`` that leaves parameters
    out of its ``Args:``, with those parameters; a class's constructor and methods where
    ``package`` wrote them."""
    checks: list[tuple[str, Callable[..., Any], str | None]] = []
    if inspect.isfunction(thing):
        checks.append((thing.__qualname__, thing, thing.__doc__))
    elif inspect.isclass(thing):
        owner = next(k for k in thing.__mro__ if "__init__" in vars(k))
        if _in(package, owner) and _in(package, owner.__init__):
            checks.append((f"{owner.__qualname__}()", thing, owner.__doc__))
        for klass in (k for k in thing.__mro__ if _in(package, k)):
            checks += [(f"{klass.__qualname__}.{name}", method, method.__doc__)
                       for name, method in _methods(klass)]
    missing = {}
    for name, function, docstring in checks:
        left_out = [p for p in _parameters(function) if p not in _documented(docstring)]
        if left_out:
            missing[name] = left_out
    return missing


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_parameter_is_documented_in_args(module):
    if PUBLIC[module] is not None:
        pytest.importorskip(PUBLIC[module], reason=f"the {PUBLIC[module]} extra")
    face = importlib.import_module(module)
    things = [getattr(face, name) for name in face.__all__]
    checked = [t for t in things if inspect.isfunction(t) or inspect.isclass(t)]
    assert checked, f"{module}.__all__ names no function or class to check"
    missing: dict[str, list[str]] = {}
    for thing in checked:
        missing.update(_undocumented(thing))
    assert missing == {}, (f"{module}: parameters not named in the Args: section of their "
                           f"docstring: {missing}")


def test_the_docstring_check_finds_what_is_left_out():
    def unwritten(path, retries=3):
        """Open ``path``."""

    def half_written(path, *names, **options):
        """Open ``path``.

        Args:
            path: Where.
            options: Not under its star name, so not ``**options``.
        """

    @dataclass(frozen=True)
    class Planted:
        """A config.

        Args:
            size: Documented.
        """

        size: int = 1
        depth: int = 2

        def resized(self, ranks, _private=None):
            """No Args: here."""

    assert _undocumented(unwritten) == {unwritten.__qualname__: ["path", "retries"]}
    assert _undocumented(half_written) == {half_written.__qualname__: ["*names", "**options"]}
    here = Planted.__module__.split(".")[0]
    assert _undocumented(Planted, here) == {f"{Planted.__qualname__}()": ["depth"],
                                            f"{Planted.__qualname__}.resized": ["ranks"]}


def test_the_docstring_check_passes_what_is_written():
    def written(path, *names, **options):
        """Open ``path``.

        Args:
            path: Where.
            *names: Which.
            **options (dict): How; a type in parentheses is Google style too.

        Returns:
            Nothing.
        """

    assert _undocumented(written) == {}
