"""Metric curves of one or several experiments, one panel per metric (matplotlib, no display)."""

from __future__ import annotations

from typing import Any

from hpckit.errors import ConfigError


def curves(series: list[tuple[str, list[dict[str, Any]]]], metrics: list[str], x_axis: str,
           output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3 * len(metrics)), squeeze=False,
                             sharex=True)
    try:
        for ax, metric in zip(axes[:, 0], metrics, strict=True):
            drawn = 0
            for name, history in series:
                points = [(_x(e, x_axis), e["metrics"].get(metric)) for e in history]
                points = [(x, y) for x, y in points if _number(x) and _number(y)]
                if points:
                    ax.plot(*zip(*points, strict=True), marker="." if len(points) < 50 else None,
                            label=name)
                    drawn += 1
            if not drawn:
                raise ConfigError(f"no experiment reported a numeric metric {metric!r} "
                                  f"(against {x_axis!r}); check the name with hpckit metrics.")
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            if len(series) > 1:
                ax.legend()
        axes[-1, 0].set_xlabel(x_axis)
        fig.tight_layout()
        fig.savefig(output, dpi=100)
    finally:
        plt.close(fig)


def _x(entry: dict[str, Any], axis: str) -> Any:
    return entry.get(axis) if axis == "step" else entry["metrics"].get(axis)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
