"""``OptunaSearch``: Ray Tune's Optuna searcher on the ``optuna`` library (the ``optuna`` extra;
this module is the only one that imports it). Its space is the Tuner's ``param_space`` of
``tune.*`` distributions, a dict of Optuna distributions, or Optuna's define-by-run function;
each trial is an Optuna trial asked of one study and told its last result, so TPE (the
default sampler) or any sampler given learns from every trial. The study is kept with the
sweep (``save``/``restore``): a rerun goes on with it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from hpckit.errors import ConfigError
from hpckit.sweep.domains import CATEGORICAL, FLOAT, INT, Choice, Domain, RandInt, Uniform
from hpckit.sweep.search.searcher import Searcher
from hpckit.sweep.space import Grid, constants

optuna: Any
ot_distributions: Any
try:
    import optuna
    from optuna import distributions as ot_distributions
except ImportError:  # pragma: no cover - the extra is missing: said when it is used
    optuna = ot_distributions = None

SEPARATOR = "/"  # nested keys, flattened as Ray flattens them


def _require() -> Any:
    if optuna is None:
        raise ConfigError("OptunaSearch needs the optuna package: pip install 'hpckit[optuna]' "
                          "(or pip install optuna).")
    return optuna


class OptunaSearch(Searcher):
    """As ``ray.tune.search.optuna.OptunaSearch``.

    Args:
        space: a dict of ``tune.*`` or Optuna distributions (nested dicts allowed), or a
            define-by-run function of an Optuna trial that may return a dict of constants;
            None takes the Tuner's ``param_space``.
        metric: the metric to optimise, or a list of metrics (multi-objective).
        mode: "min" or "max", or a list of them, one per metric.
        points_to_evaluate: configs to try first.
        sampler: an Optuna sampler (default: TPE, seeded by ``seed``).
        seed: the default sampler's seed.
        evaluated_rewards: the results of ``points_to_evaluate`` known already: they are told
            to the study instead of being run.
    """

    def __init__(self, space: dict[str, Any] | Callable[[Any], dict[str, Any] | None] | None = None,
                 metric: str | list[str] | None = None, mode: str | list[str] | None = None,
                 points_to_evaluate: list[dict[str, Any]] | None = None, sampler: Any = None,
                 seed: int | None = None, evaluated_rewards: list[Any] | None = None) -> None:
        _require()
        super().__init__(metric=metric, mode=mode)
        if sampler is not None and seed is not None:
            raise ConfigError("OptunaSearch(sampler=..., seed=...): seed the sampler you pass "
                              "instead (e.g. TPESampler(seed=...)).")
        if evaluated_rewards is not None and len(evaluated_rewards) != len(points_to_evaluate or []):
            raise ConfigError("OptunaSearch(evaluated_rewards=...) needs one reward per point of "
                              "points_to_evaluate.")
        self._space: Any = None
        self._constants: dict[str, Any] = {}
        self._points = list(points_to_evaluate or [])
        self._rewards = evaluated_rewards
        self._sampler = sampler if sampler is not None else optuna.samplers.TPESampler(seed=seed)
        self._study: Any = None
        self._live: dict[str, Any] = {}  # trial_id -> its Optuna trial
        if space is not None:
            self._set_space(space)

    def _set_space(self, space: Any) -> None:
        if callable(space):
            self._space = space
        elif isinstance(space, dict):
            self._constants = constants(space)
            self._space = optuna_space(space)
        else:
            raise ConfigError(f"OptunaSearch(space={space!r}) must be a dict of distributions or "
                              "a define-by-run function of an Optuna trial.")
        self._start()

    def _start(self) -> None:
        if self._study is not None or self._space is None or self._mode is None:
            return
        modes = self._mode if isinstance(self._mode, list) else [self._mode]
        directions: list[Any] = ["maximize" if m == "max" else "minimize" for m in modes]
        self._study = optuna.create_study(sampler=self._sampler, directions=directions)
        for index, point in enumerate(self._points):
            if self._rewards is None:
                self._study.enqueue_trial(_flat(point))
            elif isinstance(self._space, dict):
                self._tell_known(_flat(point), self._rewards[index])
            else:
                raise ConfigError("OptunaSearch(evaluated_rewards=...) needs a dict space, not "
                                  "a define-by-run function.")

    def _tell_known(self, params: dict[str, Any], reward: Any) -> None:
        values = reward if isinstance(reward, (list, tuple)) else [reward]
        self._study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: self._space[k] for k in params}, values=list(values)))

    def set_search_properties(self, metric: str | None, mode: str | None,
                              config: dict[str, Any], **spec: Any) -> bool:
        if self._space is not None and config and _has_domains(config):
            return False  # two spaces: the Tuner refuses the param_space's
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        if self._space is None:
            self._set_space(config or {})
        self._start()
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._study is None:
            raise ConfigError("OptunaSearch has no space or no mode: pass space= and mode= to "
                              "it, or param_space to the Tuner and TuneConfig(metric, mode).")
        if callable(self._space):
            trial = self._study.ask()
            extra = self._space(trial) or {}
            params = {**trial.params, **extra}
        else:
            trial = self._study.ask(fixed_distributions=self._space)
            params = dict(trial.params)
        self._live[trial_id] = trial
        return _nested({**_flat(self._constants), **params})

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        trial = self._live.get(trial_id)
        if trial is None or not isinstance(self._metric, str) or self._metric not in result:
            return
        step = result.get("training_iteration")
        if step is not None:
            trial.report(float(result[self._metric]), int(step))

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        trial = self._live.pop(trial_id, None)
        if trial is None:
            return
        metrics = self._metric if isinstance(self._metric, list) else [self._metric]
        values: list[Any] = [(result or {}).get(str(m)) for m in metrics]
        states = optuna.trial.TrialState
        if any(v is None for v in values):
            self._study.tell(trial, state=states.FAIL if error else states.PRUNED)
        else:
            told = [float(v) for v in values]
            self._study.tell(trial, told if len(told) > 1 else told[0], state=states.COMPLETE)

    def add_evaluated_point(self, parameters: dict[str, Any], value: float, error: bool = False,
                            pruned: bool = False,
                            intermediate_values: list[float] | None = None) -> None:
        if not isinstance(self._space, dict) or self._study is None:
            raise ConfigError("OptunaSearch.add_evaluated_point needs a dict space and a mode.")
        states = optuna.trial.TrialState
        state = states.FAIL if error else states.PRUNED if pruned else states.COMPLETE
        flat = _flat(parameters)
        self._study.add_trial(optuna.trial.create_trial(
            params=flat, distributions={k: self._space[k] for k in flat},
            value=None if state != states.COMPLETE else value, state=state,
            intermediate_values=dict(enumerate(intermediate_values or []))))

    @property
    def study(self) -> Any:
        """The Optuna study (its trials, ``best_params``, ``best_value``)."""
        return self._study

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"study": self._study, "live": self._live, "metric": self._metric,
                         "mode": self._mode}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        self._study, self._live = state["study"], state["live"]
        self._metric = self._metric or state["metric"]
        self._mode = self._mode or state["mode"]


def optuna_space(space: dict[str, Any]) -> dict[str, Any]:
    """``space``'s distributions as Optuna's, by flattened key (``"model/width"``)."""
    _require()
    converted = {}
    for key, value in _flat(space).items():
        if isinstance(value, Grid):
            raise ConfigError(f"OptunaSearch cannot search param_space[{key!r}], a grid_search: "
                              "use tune.choice(...) for Optuna, or the default search for grids.")
        if isinstance(value, ot_distributions.BaseDistribution):
            converted[key] = value
        elif isinstance(value, Domain):
            converted[key] = _converted(key, value)
    return converted


def _converted(key: str, domain: Domain) -> Any:
    if domain.kind == CATEGORICAL and isinstance(domain, Choice):
        return ot_distributions.CategoricalDistribution(list(domain.categories))
    if domain.kind == FLOAT and isinstance(domain, Uniform):
        return ot_distributions.FloatDistribution(domain.lower, domain.upper, log=domain.log,
                                                  step=None if domain.log else domain.q)
    if domain.kind == INT and isinstance(domain, RandInt):
        upper = domain.upper if domain.q is not None else domain.upper - 1
        return ot_distributions.IntDistribution(domain.lower, upper, log=domain.log,
                                                step=1 if domain.log else int(domain.q or 1))
    raise ConfigError(f"OptunaSearch cannot search param_space[{key!r}] ({type(domain).__name__}"
                      f"): Optuna has no {domain.kind} distribution; use uniform, loguniform, "
                      "quniform, randint, qrandint, lograndint or choice.")


def _has_domains(space: dict[str, Any]) -> bool:
    return any(isinstance(v, (Domain, Grid)) or (isinstance(v, dict) and _has_domains(v))
               for v in space.values())


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + SEPARATOR))
        else:
            out[name] = value
    return out


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        here = out
        *parents, last = key.split(SEPARATOR)
        for part in parents:
            here = here.setdefault(part, {})
        here[last] = value
    return out
