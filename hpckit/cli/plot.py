"""Metric curves of one or several experiments, one panel per metric (matplotlib, no display).

Every figure has a title, axis labels and a legend; a metric whose values span more than two
decades is drawn on a log scale (losses that fall from 100 to 0.01 are not a flat line);
steps and epochs get whole-number ticks."""

from __future__ import annotations

from typing import Any

from hpckit.errors import ConfigError

DECADES_FOR_LOG = 2.0
MAX_NAMED = 2
Series = list[tuple[str, list[dict[str, Any]]]]


def curves(series: Series, metrics: list[str], x_axis: str, output: str,
           log: bool | None = None) -> None:
    """Write the figure to ``output``; ``log`` True/False forces the scale, None decides."""
    import matplotlib.pyplot as plt

    fig = figure(series, metrics, x_axis, log)
    try:
        fig.savefig(output, dpi=100)
    finally:
        plt.close(fig)


def figure(series: Series, metrics: list[str], x_axis: str, log: bool | None = None) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3 * len(metrics)),
                             squeeze=False, sharex=True)
    try:
        for ax, metric in zip(axes[:, 0], metrics, strict=True):
            _panel(ax, series, metric, x_axis, log)
        axes[-1, 0].set_xlabel(x_axis)
        names = (", ".join(name for name, _ in series) if len(series) <= MAX_NAMED
                 else f"{len(series)} runs")  # a sweep's trials: the legend names them
        fig.suptitle(f"{' and '.join(metrics)} by {x_axis}: {names}")
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return fig


def _panel(ax: Any, series: Series, metric: str, x_axis: str, log: bool | None) -> None:
    from matplotlib.ticker import MaxNLocator

    values: list[float] = []
    whole_x = True
    for name, history in series:
        points = [(_x(e, x_axis), e["metrics"].get(metric)) for e in history]
        points = [(x, y) for x, y in points if _number(x) and _number(y)]
        if points:
            ax.plot(*zip(*points, strict=True), marker="." if len(points) < 50 else None,
                    label=name)
            values.extend(float(y) for _, y in points)
            whole_x = whole_x and all(float(x).is_integer() for x, _ in points)
    if not values:
        raise ConfigError(f"no experiment reported a numeric metric {metric!r} "
                          f"(against {x_axis!r}); check the name with hpckit metrics.")
    if log or (log is None and _spans_decades(values)):
        ax.set_yscale("log")
    if whole_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()


def _spans_decades(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return (len(positive) == len(values) and min(positive) > 0
            and max(positive) / min(positive) > 10 ** DECADES_FOR_LOG)


def _x(entry: dict[str, Any], axis: str) -> Any:
    return entry.get(axis) if axis == "step" else entry["metrics"].get(axis)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
