"""The function API of Ray Tune's checkpoint guide, on hpckit's report: a trainable
``fn(config, checkpoint_dir=None)`` that saves inside ``with tune.checkpoint_dir(step=...) as
d:`` and reports with ``tune.report(**metrics)``.

The directory from ``checkpoint_dir`` becomes the checkpoint of the next report (named
``checkpoint_<step>`` when a step is given, as Ray names it); on resume the trainable gets
its trial's latest committed checkpoint as ``checkpoint_dir``. Trainables of the current
form, ``fn(config)``, run unchanged.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError
from hpckit.experiment.manifest import custom_dirname_problem
from hpckit.run.session import session

_pending: tuple[str, int | None] | None = None  # this rank's directory for the next report
OPTIONS = ("checkpoint_dir_name", "checkpoint_upload_mode", "delete_local_checkpoint_after_upload")


@contextlib.contextmanager
def checkpoint_dir(step: int | None = None) -> Iterator[str]:
    """A fresh directory to save into; what is in it when the block ends is the checkpoint
    of the next ``tune.report()``.

    Args:
        step: The training step (an integer >= 0) that names the checkpoint
            ``checkpoint_<step>``, as Ray names it; None (the default) leaves hpckit's name.

    Raises:
        ConfigError: ``step`` is not an integer >= 0 or None.
    """
    global _pending
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ConfigError(f"tune.checkpoint_dir(step={step!r}) takes a training step (an "
                          "integer >= 0), or None.")
    directory = tempfile.mkdtemp(prefix="hpckit-tune-checkpoint-")
    yield directory
    if _pending is not None:
        shutil.rmtree(_pending[0], ignore_errors=True)
    _pending = (directory, step)


def report(metrics: dict[str, Any] | None = None, checkpoint: Checkpoint | None = None,
           **kwargs: Any) -> None:
    """``tune.report(**metrics)`` (the guide's form) or ``tune.report(metrics, checkpoint=...,
    ...)`` (today's, with hpckit.report's keywords); a directory from
    ``tune.checkpoint_dir()`` goes with the next one.

    Args:
        metrics: The metrics dict (today's form); None (the default) takes the keyword
            metrics instead.
        checkpoint: This rank's checkpoint, as for ``hpckit.report``; None (the default)
            hands the directory of the last ``tune.checkpoint_dir()`` block, if any.
        **kwargs: The guide's keyword metrics (``tune.report(auc=0.9)``), where no
            ``metrics`` is given, and ``hpckit.report``'s ``checkpoint_dir_name``,
            ``checkpoint_upload_mode`` and ``delete_local_checkpoint_after_upload``.

    Raises:
        ConfigError: Both a metrics dict and keyword metrics are given; or as
            ``hpckit.report``.
    """
    global _pending
    options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
    if metrics is not None and kwargs:
        raise ConfigError("tune.report() takes a metrics dict or keyword metrics, not both: "
                          "tune.report({'auc': 0.9}) or tune.report(auc=0.9).")
    values = dict(metrics if metrics is not None else kwargs)
    if _pending is None or checkpoint is not None:
        session.report(values, checkpoint, **options)
        return
    directory, step = _pending
    _pending = None
    name = f"checkpoint_{step}" if step is not None else None
    if name and custom_dirname_problem(name) is None:
        options.setdefault("checkpoint_dir_name", name)
    options.setdefault("delete_local_checkpoint_after_upload", True)
    try:
        session.report(values, Checkpoint.from_directory(directory), **options)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class GuideFunction:
    """A trainable of either form as the training function of one trial (picklable, so that
    a sweep's ranks started elsewhere can run it); ``restore`` is tune.run's checkpoint to
    start from when the trial has none of its own."""

    def __init__(self, fn: Callable[..., Any], restore: str | None = None) -> None:
        self.fn = fn
        self.restore = restore
        self.__name__ = getattr(fn, "__name__", "trainable")

    def __call__(self, config: dict[str, Any]) -> Any:
        global _pending
        _pending = None
        if not takes_checkpoint_dir(self.fn):
            return self.fn(config)
        checkpoint = session.get_checkpoint()
        if checkpoint is None and self.restore is not None:
            checkpoint = Checkpoint.from_directory(os.path.abspath(self.restore))
        if checkpoint is None:
            return self.fn(config, checkpoint_dir=None)
        with checkpoint.as_directory() as directory:
            return self.fn(config, checkpoint_dir=directory)


def takes_checkpoint_dir(fn: Callable[..., Any]) -> bool:
    try:
        return "checkpoint_dir" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
