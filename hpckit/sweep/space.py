"""Search spaces, as Ray Tune writes them, and the trials they expand to.

``param_space`` is a dict (nested dicts allowed) whose values are constants, a
:func:`grid_search` (every value is tried) or a distribution (:func:`choice`,
:func:`uniform`, :func:`loguniform`, :func:`randint`: one draw per trial). As in Ray Tune,
``num_samples`` repeats the whole grid, drawing fresh values for the distributions each time.
The draws come from one seeded generator, so the same space, ``num_samples`` and seed give
the same trials on every rerun.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpckit.errors import ConfigError


@dataclass(frozen=True)
class Grid:
    """Every one of ``values`` is tried (with every value of the other grids)."""

    values: tuple[Any, ...]


class Domain:
    """A distribution that each trial draws one value from."""

    def sample(self, rng: random.Random) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Choice(Domain):
    categories: tuple[Any, ...]

    def sample(self, rng: random.Random) -> Any:
        return self.categories[rng.randrange(len(self.categories))]


@dataclass(frozen=True)
class Uniform(Domain):
    lower: float
    upper: float

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.lower, self.upper)


@dataclass(frozen=True)
class LogUniform(Domain):
    lower: float
    upper: float

    def sample(self, rng: random.Random) -> float:
        return math.exp(rng.uniform(math.log(self.lower), math.log(self.upper)))


@dataclass(frozen=True)
class RandInt(Domain):
    lower: int
    upper: int  # exclusive, as in Ray Tune

    def sample(self, rng: random.Random) -> int:
        return rng.randrange(self.lower, self.upper)


def grid_search(values: Sequence[Any]) -> Grid:
    """Try every one of ``values``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ConfigError(f"grid_search({values!r}) needs a non-empty list of values to try, "
                          "e.g. grid_search([0.01, 0.1]).")
    return Grid(tuple(values))


def choice(categories: Sequence[Any]) -> Choice:
    """One of ``categories``, uniformly."""
    if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence) or not categories:
        raise ConfigError(f"choice({categories!r}) needs a non-empty list to choose from, "
                          "e.g. choice([32, 64, 128]).")
    return Choice(tuple(categories))


def uniform(lower: float, upper: float) -> Uniform:
    """A float drawn uniformly from [lower, upper)."""
    _check_bounds("uniform", lower, upper)
    return Uniform(float(lower), float(upper))


def loguniform(lower: float, upper: float) -> LogUniform:
    """A float whose logarithm is uniform: for learning rates, e.g. loguniform(1e-4, 1e-1)."""
    _check_bounds("loguniform", lower, upper)
    if lower <= 0:
        raise ConfigError(f"loguniform({lower!r}, {upper!r}) needs 0 < lower < upper "
                          "(a logarithm is taken), e.g. loguniform(1e-4, 1e-1).")
    return LogUniform(float(lower), float(upper))


def randint(lower: int, upper: int) -> RandInt:
    """An integer in [lower, upper): ``upper`` is excluded, as in Ray Tune."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lower, upper)):
        raise ConfigError(f"randint({lower!r}, {upper!r}) needs integers, e.g. randint(1, 10).")
    _check_bounds("randint", lower, upper)
    return RandInt(lower, upper)


def _check_bounds(name: str, lower: Any, upper: Any) -> None:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lower, upper))
    if not numbers or not lower < upper:
        raise ConfigError(f"{name}({lower!r}, {upper!r}) needs two numbers with lower < upper.")


def expand(space: dict[str, Any], num_samples: int, seed: int) -> list[dict[str, Any]]:
    """The trials' params, in order: for each sample, every combination of the grids."""
    if not isinstance(space, dict):
        raise ConfigError(f"param_space={space!r} must be a dict of parameter names to values, "
                          "grid_search(...) or distributions such as uniform(0, 1).")
    _refuse_foreign(space, "param_space")
    grids = [(path, value) for path, value in _leaves(space) if isinstance(value, Grid)]
    rng = random.Random(seed)
    trials = []
    for _ in range(num_samples):
        for combination in itertools.product(*(grid.values for _, grid in grids)):
            chosen = dict(zip((path for path, _ in grids), combination, strict=True))
            trials.append(_resolve(space, (), chosen, rng))
    return trials


def varied(space: dict[str, Any]) -> list[tuple[str, ...]]:
    """The paths of the parameters that differ between trials (grids and distributions)."""
    return [path for path, value in _leaves(space) if isinstance(value, (Grid, Domain))]


def _leaves(space: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for key, value in space.items():
        if isinstance(value, dict):
            found.extend(_leaves(value, (*prefix, str(key))))
        else:
            found.append(((*prefix, str(key)), value))
    return found


def _resolve(space: dict[str, Any], prefix: tuple[str, ...], chosen: dict[tuple[str, ...], Any],
             rng: random.Random) -> dict[str, Any]:
    resolved: dict[str, Any] = {}
    for key, value in space.items():
        path = (*prefix, str(key))
        if isinstance(value, dict):
            resolved[key] = _resolve(value, path, chosen, rng)
        elif isinstance(value, Grid):
            resolved[key] = chosen[path]
        elif isinstance(value, Domain):
            resolved[key] = value.sample(rng)
        else:
            resolved[key] = value
    return resolved


def _refuse_foreign(space: dict[str, Any], where: str) -> None:
    """A search-space object from another library (Ray's own, Optuna's) would be passed to
    the trials as a constant: say so instead."""
    for path, value in _leaves(space):
        module = type(value).__module__.split(".")[0]
        if module in ("ray", "optuna", "hyperopt", "ax") or (
                type(value).__name__ in ("Categorical", "Float", "Integer", "Function")):
            name = ".".join(path)
            raise ConfigError(f"{where}[{name!r}] is a {type(value).__module__}."
                              f"{type(value).__name__}, which hpckit cannot sample: use "
                              "hpckit.tune.grid_search, choice, uniform, loguniform or randint.")
