"""The distributions of a search space, with Ray Tune's names and bounds: each trial draws one
value from each (``uniform``, ``quniform``, ``loguniform``, ``qloguniform``, ``randn``,
``qrandn``, ``randint``, ``qrandint``, ``lograndint``, ``qlograndint``, ``choice``), and
``sample_from`` computes one from the rest of the trial's config.

Bounds follow Ray's: ``randint`` and ``lograndint`` exclude ``upper``; a quantized
distribution (``q``) rounds each draw to a multiple of ``q``, which makes ``upper``
reachable. A search algorithm such as Optuna reads a domain's ``kind``, bounds, ``log`` and
``q`` to build its own space (:func:`hpckit.sweep.search.optuna.optuna_space`).
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hpckit.errors import ConfigError

FLOAT, INT, CATEGORICAL, NORMAL, FUNCTION = "float", "int", "categorical", "normal", "function"


class Domain:
    """A distribution that each trial draws one value from."""

    kind = ""

    def sample(self, rng: random.Random) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Choice(Domain):
    categories: tuple[Any, ...]
    kind = CATEGORICAL

    def sample(self, rng: random.Random) -> Any:
        return self.categories[rng.randrange(len(self.categories))]


@dataclass(frozen=True)
class Uniform(Domain):
    """A float in [lower, upper), uniform or (``log``) log-uniform, rounded to ``q``."""

    lower: float
    upper: float
    log: bool = False
    q: float | None = None
    kind = FLOAT

    def sample(self, rng: random.Random) -> float:
        if self.log:
            value = math.exp(rng.uniform(math.log(self.lower), math.log(self.upper)))
        else:
            value = rng.uniform(self.lower, self.upper)
        return value if self.q is None else _quantized(value, self.q, self.lower, self.upper)


@dataclass(frozen=True)
class Normal(Domain):
    """A float drawn from N(mean, sd²), rounded to ``q``."""

    mean: float
    sd: float
    q: float | None = None
    kind = NORMAL

    def sample(self, rng: random.Random) -> float:
        value = rng.gauss(self.mean, self.sd)
        return value if self.q is None else round(value / self.q) * self.q


@dataclass(frozen=True)
class RandInt(Domain):
    """An integer in [lower, upper) (``upper`` excluded, as in Ray Tune), uniform or (``log``)
    log-uniform; with ``q``, a multiple of it in [lower, upper] (then ``upper`` included)."""

    lower: int
    upper: int
    log: bool = False
    q: int | None = None
    kind = INT

    def sample(self, rng: random.Random) -> int:
        top = self.upper if self.q is None else self.upper + 1
        if self.log:
            value = int(math.exp(rng.uniform(math.log(self.lower), math.log(top))))
            value = min(max(value, self.lower), top - 1)
        else:
            value = rng.randrange(self.lower, top)
        return value if self.q is None else int(_quantized(value, self.q, self.lower, self.upper))


@dataclass(frozen=True)
class SampleFrom(Domain):
    """A value that ``func(spec)`` computes, ``spec.config`` being the trial's config with
    every other parameter drawn (as Ray passes it)."""

    func: Callable[..., Any]
    kind = FUNCTION

    def sample(self, rng: random.Random) -> Any:
        return call_seeded(self.func, Spec({}), rng)


class Spec(dict[str, Any]):
    """What ``sample_from``'s function gets: ``spec.config`` (or ``spec["config"]``), the
    trial's config, whose keys read as attributes too (``spec.config.lr``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config=_Attributes(config))

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


class _Attributes(dict[str, Any]):
    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__({k: _Attributes(v) if isinstance(v, dict) else v
                          for k, v in values.items()})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(f"the config has no {name!r} (yet)") from exc


def call_seeded(func: Callable[..., Any], spec: Spec, rng: random.Random) -> Any:
    """``func(spec)`` with Python's and NumPy's global generators seeded from ``rng`` for the
    call, then put back: a function drawing from ``np.random`` gives the same value in every
    rerun of the sweep, and the user's own streams are left as they were."""
    with _seeded_globals(rng.randrange(2**32)):
        try:
            return func(spec)
        except TypeError:
            if _takes_no_argument(func):
                return func()
            raise


@contextmanager
def _seeded_globals(seed: int) -> Iterator[None]:
    numpy = sys.modules.get("numpy")
    saved = random.getstate()
    saved_numpy = numpy.random.get_state() if numpy is not None else None
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)
        if numpy is not None:
            numpy.random.set_state(saved_numpy)


def _takes_no_argument(func: Callable[..., Any]) -> bool:
    import inspect

    try:
        return not inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def _quantized(value: float, q: float, lower: float, upper: float) -> float:
    """``value`` rounded to a multiple of ``q``, kept within [lower, upper]."""
    rounded = round(value / q) * q
    while rounded > upper:
        rounded -= q
    while rounded < lower:
        rounded += q
    return rounded


def choice(categories: Sequence[Any]) -> Choice:
    """One of ``categories``, uniformly.

    Args:
        categories: a non-empty list of values.
    """
    if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence) or not categories:
        raise ConfigError(f"choice({categories!r}) needs a non-empty list to choose from, "
                          "e.g. choice([32, 64, 128]).")
    return Choice(tuple(categories))


def uniform(lower: float, upper: float) -> Uniform:
    """A float drawn uniformly from [lower, upper).

    Args:
        lower: the smallest value.
        upper: the bound, excluded.
    """
    _check_bounds("uniform", lower, upper)
    return Uniform(float(lower), float(upper))


def quniform(lower: float, upper: float, q: float) -> Uniform:
    """A float drawn uniformly from [lower, upper], rounded to a multiple of ``q``.

    Args:
        lower: the smallest value.
        upper: the largest value.
        q: the step the value is rounded to, e.g. 0.1.
    """
    _check_bounds("quniform", lower, upper)
    return Uniform(float(lower), float(upper), q=_step("quniform", q))


def loguniform(lower: float, upper: float, base: float = 10) -> Uniform:
    """A float whose logarithm is uniform: for learning rates, e.g. ``loguniform(1e-4, 1e-1)``.

    Args:
        lower: the smallest value, > 0.
        upper: the bound, excluded.
        base: the logarithm's base (the distribution is the same for any base).
    """
    _check_positive("loguniform", lower, upper, base)
    return Uniform(float(lower), float(upper), log=True)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Uniform:
    """A log-uniform float in [lower, upper], rounded to a multiple of ``q``.

    Args:
        lower: the smallest value, > 0.
        upper: the largest value.
        q: the step the value is rounded to.
        base: the logarithm's base.
    """
    _check_positive("qloguniform", lower, upper, base)
    return Uniform(float(lower), float(upper), log=True, q=_step("qloguniform", q))


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """A float drawn from the normal distribution N(mean, sd²).

    Args:
        mean: the distribution's mean.
        sd: its standard deviation, > 0.
    """
    _check_normal("randn", mean, sd)
    return Normal(float(mean), float(sd))


def qrandn(mean: float, sd: float, q: float) -> Normal:
    """A normal draw rounded to a multiple of ``q``.

    Args:
        mean: the distribution's mean.
        sd: its standard deviation, > 0.
        q: the step the value is rounded to.
    """
    _check_normal("qrandn", mean, sd)
    return Normal(float(mean), float(sd), q=_step("qrandn", q))


def randint(lower: int, upper: int) -> RandInt:
    """An integer in [lower, upper): ``upper`` is excluded, as in Ray Tune.

    Args:
        lower: the smallest value.
        upper: the bound, excluded.
    """
    _check_ints("randint", lower, upper)
    return RandInt(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> RandInt:
    """A multiple of ``q`` in [lower, upper]: ``upper`` is included, as in Ray Tune.

    Args:
        lower: the smallest value.
        upper: the largest value.
        q: the step, an integer >= 1.
    """
    _check_ints("qrandint", lower, upper)
    return RandInt(lower, upper, q=int(_step("qrandint", q, integer=True)))


def lograndint(lower: int, upper: int, base: float = 10) -> RandInt:
    """An integer in [lower, upper) whose logarithm is uniform.

    Args:
        lower: the smallest value, >= 1.
        upper: the bound, excluded.
        base: the logarithm's base.
    """
    _check_ints("lograndint", lower, upper)
    _check_positive("lograndint", lower, upper, base)
    return RandInt(lower, upper, log=True)


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> RandInt:
    """A log-uniform integer in [lower, upper] rounded to a multiple of ``q``.

    Args:
        lower: the smallest value, >= 1.
        upper: the largest value, included.
        q: the step, an integer >= 1.
        base: the logarithm's base.
    """
    _check_ints("qlograndint", lower, upper)
    _check_positive("qlograndint", lower, upper, base)
    return RandInt(lower, upper, log=True, q=int(_step("qlograndint", q, integer=True)))


def sample_from(func: Callable[..., Any]) -> SampleFrom:
    """A value computed by ``func(spec)`` once the trial's other parameters are drawn:
    ``sample_from(lambda spec: spec.config.width * 2)``. Its own draws (``np.random``,
    ``random``) are seeded from the sweep's seed, so a rerun computes the same values.

    Args:
        func: a function of ``spec`` (``spec.config``: the trial's config), or of nothing.
    """
    if not callable(func):
        raise ConfigError(f"sample_from({func!r}) needs a function, e.g. "
                          "sample_from(lambda spec: spec.config.lr * 10).")
    return SampleFrom(func)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_bounds(name: str, lower: Any, upper: Any) -> None:
    if not (_number(lower) and _number(upper)) or not lower < upper:
        raise ConfigError(f"{name}({lower!r}, {upper!r}) needs two numbers with lower < upper.")


def _check_positive(name: str, lower: Any, upper: Any, base: Any) -> None:
    _check_bounds(name, lower, upper)
    if lower <= 0:
        raise ConfigError(f"{name}({lower!r}, {upper!r}) needs 0 < lower < upper (a logarithm "
                          f"is taken), e.g. {name}(1e-4, 1e-1).")
    if not _number(base) or base <= 0 or base == 1:
        raise ConfigError(f"{name}(..., base={base!r}) needs a base > 0 other than 1, e.g. 10.")


def _check_ints(name: str, lower: Any, upper: Any) -> None:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lower, upper)):
        raise ConfigError(f"{name}({lower!r}, {upper!r}) needs integers, e.g. {name}(1, 10).")
    _check_bounds(name, lower, upper)


def _check_normal(name: str, mean: Any, sd: Any) -> None:
    if not (_number(mean) and _number(sd)) or sd <= 0:
        raise ConfigError(f"{name}(mean={mean!r}, sd={sd!r}) needs a number and a standard "
                          "deviation > 0, e.g. randn(0.0, 1.0).")


def _step(name: str, q: Any, integer: bool = False) -> float:
    if not _number(q) or q <= 0 or (integer and not isinstance(q, int)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name}(..., q={q!r}) needs {kind} > 0: the step each draw is "
                          "rounded to.")
    return float(q)
