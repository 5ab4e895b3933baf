"""Search spaces, as Ray Tune writes them, and the trials they expand to.

``param_space`` is a dict (nested dicts allowed) whose values are constants, a
:func:`grid_search` (every value is tried) or a distribution of :mod:`.domains` (one draw per
trial; a ``sample_from`` is computed last, from the others). As in Ray Tune, ``num_samples``
repeats the whole grid, drawing fresh values for the distributions each time (or, with
``constant_grid_search``, once per repetition); ``points_to_evaluate`` fix some values of
the first repetitions. The draws come from one seeded generator, so the same space,
``num_samples`` and seed give the same trials on every rerun.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpckit.errors import ConfigError
from hpckit.sweep.domains import Domain, SampleFrom, Spec, call_seeded


@dataclass(frozen=True)
class Grid:
    """Every one of ``values`` is tried (with every value of the other grids)."""

    values: tuple[Any, ...]


def grid_search(values: Sequence[Any]) -> Grid:
    """Try every one of ``values``.

    Args:
        values: a non-empty list of values, each tried with every value of the other grids.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ConfigError(f"grid_search({values!r}) needs a non-empty list of values to try, "
                          "e.g. grid_search([0.01, 0.1]).")
    return Grid(tuple(values))


def expand(space: dict[str, Any], num_samples: int, seed: int,
           points: Sequence[dict[str, Any]] = (), constant_grid: bool = False,
           ) -> list[dict[str, Any]]:
    """The trials' params, in order: for each sample, every combination of the grids. The
    ``points`` (``points_to_evaluate``) set their values in the first samples;
    ``constant_grid`` draws a sample's distributions once for all of its grid combinations."""
    if not isinstance(space, dict):
        raise ConfigError(f"param_space={space!r} must be a dict of parameter names to values, "
                          "grid_search(...) or distributions such as uniform(0, 1).")
    _refuse_foreign(space, "param_space")
    grids = [(path, value) for path, value in leaves(space) if isinstance(value, Grid)]
    rng = random.Random(seed)
    trials = []
    for sample in range(num_samples):
        fixed = _flat(points[sample]) if sample < len(points) else {}
        drawn = _draws(space, rng) if constant_grid else None
        for combination in itertools.product(*(grid.values for _, grid in grids)):
            chosen = {**dict(zip((path for path, _ in grids), combination, strict=True)),
                      **(drawn or _draws(space, rng)), **fixed}
            trials.append(_computed(_resolve(space, (), chosen), space, rng))
    return trials


def constants(space: dict[str, Any]) -> dict[str, Any]:
    """``space`` without its grids and distributions: what a search algorithm's suggestion
    is merged into."""
    return {k: constants(v) if isinstance(v, dict) else v for k, v in space.items()
            if isinstance(v, dict) or not isinstance(v, (Grid, Domain))}


def merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``update``'s values set, nested dicts merged key by key."""
    out = dict(base)
    for key, value in update.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def varied(space: dict[str, Any]) -> list[tuple[str, ...]]:
    """The paths of the parameters that differ between trials (grids and distributions)."""
    return [path for path, value in leaves(space) if isinstance(value, (Grid, Domain))]


def leaves(space: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for key, value in space.items():
        if isinstance(value, dict):
            found.extend(leaves(value, (*prefix, str(key))))
        else:
            found.append(((*prefix, str(key)), value))
    return found


def _draws(space: dict[str, Any], rng: random.Random) -> dict[tuple[str, ...], Any]:
    """One value of every distribution but ``sample_from``, in the space's order."""
    return {path: value.sample(rng) for path, value in leaves(space)
            if isinstance(value, Domain) and not isinstance(value, SampleFrom)}


def _flat(point: Any) -> dict[tuple[str, ...], Any]:
    if not isinstance(point, dict):
        raise ConfigError(f"points_to_evaluate holds {point!r}: each point is a dict of "
                          "parameter names to values, e.g. {'lr': 0.01}.")
    return dict(leaves(point))


def _resolve(space: dict[str, Any], prefix: tuple[str, ...],
             chosen: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    resolved: dict[str, Any] = {}
    for key, value in space.items():
        path = (*prefix, str(key))
        if isinstance(value, dict):
            resolved[key] = _resolve(value, path, chosen)
        elif path in chosen:
            resolved[key] = chosen[path]
        else:
            resolved[key] = value
    return resolved


def _computed(config: dict[str, Any], space: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``config`` with each ``sample_from`` left in it computed from the rest, in order."""
    for path, value in leaves(space):
        here = config
        for key in path[:-1]:
            here = here[key]
        if isinstance(here.get(path[-1]), SampleFrom):
            here[path[-1]] = call_seeded(value.func, Spec(config), rng)
    return config


def _refuse_foreign(space: dict[str, Any], where: str) -> None:
    """A search-space object from another library (Ray's own, Optuna's) would be passed to
    the trials as a constant: say so instead."""
    for path, value in leaves(space):
        module = type(value).__module__.split(".")[0]
        if module in ("ray", "optuna", "hyperopt", "ax") or (
                type(value).__name__ in ("Categorical", "Float", "Integer", "Function")):
            name = ".".join(path)
            raise ConfigError(f"{where}[{name!r}] is a {type(value).__module__}."
                              f"{type(value).__name__}, which hpckit cannot sample: use "
                              "hpckit.tune.grid_search or its distributions (choice, uniform, "
                              "loguniform, randint, ...).")
