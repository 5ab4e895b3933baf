"""The ``hpckit`` click group, and the one mapping from errors to what a person sees.

Every failure prints one line, ``hpckit: error: ...``, naming the path and the fix, and exits
with a documented status; tracebacks only with ``--debug`` or ``HPCKIT_LOG_LEVEL=DEBUG``.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

import click

from hpckit import exits, logs, settings
from hpckit.errors import ConfigError, ExperimentLockedError, HpckitError, StorageError, how_to_report
from hpckit.storage.uris import redact

VERSION = "0.1.0"


class CommandError(click.ClickException):
    """An error shown as one line; its class says the exit status."""

    exit_code = exits.FAILED

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"hpckit: error: {self.format_message()}", err=True, file=file)


class _UsageFailure(CommandError):
    exit_code = exits.USAGE


class _StorageFailure(CommandError):
    exit_code = exits.STORAGE


def as_command_error(error: HpckitError) -> CommandError:
    """The one mapping from hpckit's errors to exit statuses."""
    message = redact(str(error))
    if isinstance(error, (ConfigError, ExperimentLockedError)):
        return _UsageFailure(message)
    if isinstance(error, StorageError):
        return _StorageFailure(message)
    return CommandError(message)


def as_one_line(error: click.UsageError) -> CommandError:
    """A usage error (a bad option, a path that is not an experiment) in the same one line as
    every other failure, not click's usage block; a bad parameter also names the help."""
    message = redact(error.format_message())
    if type(error) is not click.UsageError and error.ctx is not None:
        message = f"{message.rstrip('.')} (see {error.ctx.command_path} --help)."
    return _UsageFailure(message)


class _Group(click.Group):
    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:  # hpckit's own options (hpckit --nope), parsed before invoke
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise as_one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise as_one_line(exc) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except BrokenPipeError:  # hpckit metrics EXP | head: the reader has all it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(exits.BROKEN_PIPE) from None
        except HpckitError as exc:
            if _debugging(ctx):
                raise
            raise as_command_error(exc) from None
        except Exception as exc:
            if _debugging(ctx):
                raise
            raise CommandError(f"unexpected {type(exc).__name__}: {redact(str(exc))} (this is a "
                               f"bug in hpckit; {how_to_report()})") from None


def _debugging(ctx: click.Context) -> bool:
    return bool(ctx.meta.get("hpckit.debug")) or logs.debugging()


@click.group(cls=_Group)
@click.version_option(VERSION, prog_name="hpckit")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Batch training on HPC clusters: run, resume and inspect hpckit experiments.

    Exit status: 0 success; 1 the command failed (a check failed, training failed); 2 a bad
    argument, not an experiment, or an experiment in use; 3 storage could not be read or
    written; 75 a run stopped on request (it was requeued, or hpckit resume EXPERIMENT
    continues it); 77 a run stopped because another run took its experiment over (never
    restarted; hpckit verify EXPERIMENT once that run ends); 130 a run interrupted by
    Ctrl-C (hpckit resume EXPERIMENT continues it).
    The last log line names EXPERIMENT.
    """
    ctx.meta["hpckit.debug"] = debug
    settings.refresh()
    logs.configure(0, "DEBUG" if debug else None)
