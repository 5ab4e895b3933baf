"""``hpckit ls SWEEP``: a sweep's trials as a table, as Ray Tune's progress table shows them:
status, the params that vary, the best value of the sweep's metric, checkpoints kept."""

from __future__ import annotations

from dataclasses import asdict

import click

from hpckit.cli.tables import echo_json, echo_table, number
from hpckit.storage.location import Location
from hpckit.sweep.record import SweepManifest
from hpckit.sweep.status import counts, trial_states, varied


def list_sweep(location: Location, sweep: SweepManifest, as_json: bool) -> None:
    states = trial_states(location, sweep)
    if as_json:
        echo_json([asdict(s) for s in states])
        return
    params = varied(states)
    header = ["TRIAL", "STATUS", *params, f"BEST {sweep.metric or '-'}", "CHECKPOINTS"]
    table = [[s.trial, s.status, *(number(s.config.get(k)) for k in params), number(s.best),
              str(s.checkpoints)] for s in states]
    echo_table(header, table, [False, False, *([True] * len(params)), True, True])
    click.echo(f"{len(states)} trial(s): " + ", ".join(f"{n} {s}"
                                                       for s, n in counts(states).items()))
