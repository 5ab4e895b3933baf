"""Starting ranks (``python train.py`` with num_workers > 1) and ending them on failure.

hpckit re-runs the user's script under ``mpiexec`` the way multiprocessing's spawn does: each
rank imports the main file as ``__mp_main__`` (so ``if __name__ == "__main__":`` blocks do not
run), stops that import at the script's own ``fit()`` call, and then runs the pickled trainer.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpckit import _comm, _experiment, _stop
from hpckit._env import Environment, variable
from hpckit._log import log
from hpckit._stop import EXIT_STOPPED
from hpckit._uri import Location, redact
from hpckit.errors import HpckitError, LaunchError, TrainingFailedError

if TYPE_CHECKING:
    from hpckit._trainer import DataParallelTrainer
    from hpckit.result import Result

importing_main = False
ABORT_GRACE = 0.5


class MainImported(BaseException):
    """Raised by fit() while a spawned rank imports the user's script: stop the import there."""


def spawn(trainer: DataParallelTrainer, env: Environment) -> Result:
    """Start ``num_workers`` ranks on this node under mpiexec; restart them on failure."""
    from hpckit.result import Result

    n = trainer.scaling_config.num_workers
    trainer = trainer._named(env)
    name = trainer.run_config.name
    assert name is not None, "_named() always sets a name"
    root = trainer._storage_root(env)
    _experiment.preflight(root, name)
    command = [*_mpiexec(env), "-n", str(n), sys.executable, "-m", "hpckit._worker"]
    limit = trainer.run_config.failure_config.max_failures
    payload = tempfile.mkdtemp(prefix="hpckit-launch-", dir=env.local_dir)
    try:
        _write_payload(payload, trainer)
        attempt = 0
        while True:
            log.info("starting %d ranks (attempt %d): %s", n, attempt, " ".join(command))
            code = _run(command, payload, attempt)
            if code == 0:
                return Result.from_path(root.join(name).path, root.filesystem)
            if code == EXIT_STOPPED:
                raise SystemExit(EXIT_STOPPED)
            failure = _read_failures(payload, code)
            if isinstance(failure, HpckitError) and not isinstance(failure, TrainingFailedError):
                raise failure
            _record_failure(root.join(name), failure)
            if limit != -1 and attempt >= limit:
                raise failure
            attempt += 1
            log.warning("attempt %d failed; restarting from the last committed checkpoint "
                        "(restart %d of %s):\n%s", attempt - 1, attempt,
                        "unlimited" if limit == -1 else limit, failure)
    finally:
        shutil.rmtree(payload, ignore_errors=True)


def _record_failure(experiment: Location, failure: BaseException) -> None:
    """The ranks were aborted before they could say so: mark the attempt failed for them."""
    try:
        manifest = _experiment.read_manifest(experiment)
    except HpckitError:
        return
    if manifest and manifest.attempts and manifest.attempts[-1].get("status") == "running":
        _experiment.end_attempt(experiment, manifest, "failed", str(failure).split("\n", 1)[0])


def _mpiexec(env: Environment) -> list[str]:
    found = env.mpiexec or shutil.which("mpiexec", path=os.path.dirname(sys.executable)) \
        or shutil.which("mpiexec")
    if not found:
        raise LaunchError(
            "num_workers > 1 needs mpiexec to start the ranks, and none was found next to "
            f"{sys.executable} or on PATH; pip install mpich, or set {variable('mpiexec')}.")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot run {found} --version: {exc}") from None
    # Hydra would use the Slurm allocation's nodes; hpckit starts ranks on this node only.
    return [found, "-launcher", "fork"] if "HYDRA" in version else [found]


def _write_payload(payload: str, trainer: DataParallelTrainer) -> None:
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if not path:
        raise LaunchError(
            "ScalingConfig(num_workers > 1) from an interactive session: hpckit starts the ranks "
            "by re-running a script file. Put the code in a .py file, or launch with "
            "mpiexec -n N python script.py.")
    try:
        data = pickle.dumps(trainer)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise LaunchError(
            f"the trainer cannot be sent to the ranks ({exc}); define "
            f"{trainer.train_loop_per_worker.__qualname__} at module level (not a lambda or a "
            "nested function) and keep train_loop_config picklable.") from None
    with open(os.path.join(payload, "trainer.pkl"), "wb") as f:
        f.write(data)
    spec = {"main": os.path.abspath(path), "argv": sys.argv, "sys_path": sys.path,
            "cwd": os.getcwd()}
    with open(os.path.join(payload, "main.json"), "w") as f:
        json.dump(spec, f)
    os.makedirs(os.path.join(payload, "errors"))


def _run(command: list[str], payload: str, attempt: int) -> int:
    for stale in os.listdir(os.path.join(payload, "errors")):
        os.unlink(os.path.join(payload, "errors", stale))
    return run_process(command, {variable("worker"): payload, variable("attempt"): str(attempt),
                                 variable("run_id"): os.path.basename(payload)})


def run_script(ranks: int, argv: list[str], max_failures: int, cwd: str | None = None,
               extra_env: dict[str, str] | None = None) -> int:
    """``hpckit run``: start ``ranks`` ranks of a script under mpiexec, restarting it after a
    failure up to ``max_failures`` times (-1: no limit); each attempt resumes from the
    manifest. Returns the exit status: 0, EXIT_STOPPED, or the last failure's."""
    env = Environment.read()
    command = [*_mpiexec(env), "-n", str(ranks), sys.executable, *argv]
    attempt = 0
    ids = {variable("run_id"): env.run_id or f"run-{uuid.uuid4().hex}"}
    while True:
        log.info("attempt %d: %s", attempt, redact(" ".join(command)))
        code = run_process(command, {**(extra_env or {}), **ids, variable("attempt"): str(attempt)},
                           cwd)
        if code in (0, EXIT_STOPPED) or (max_failures != -1 and attempt >= max_failures):
            return code
        attempt += 1
        log.warning("attempt %d exited with status %d; restarting (restart %d of %s)",
                    attempt - 1, code, attempt, "unlimited" if max_failures == -1 else max_failures)


def run_process(command: list[str], extra_env: dict[str, str], cwd: str | None = None) -> int:
    """Run the ranks' launcher and wait. SIGTERM goes to the launcher, so a killed parent does
    not orphan its ranks; the stop signal goes to the ranks themselves, whose PIDs they record
    in $HPCKIT_PID_DIR, since mpiexec (hydra) dies of SIGUSR2 instead of forwarding it."""
    pids = tempfile.mkdtemp(prefix="hpckit-pids-")
    process = subprocess.Popen(command, env={**os.environ, **extra_env,
                                             variable("pid_dir"): pids}, cwd=cwd)
    stop = _stop.parse_signal(Environment.read().stop_signal)

    def forward(signum: int, _frame: Any) -> None:
        if signum != stop:
            process.send_signal(signum)
            return
        for name in os.listdir(pids):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(name), signum)

    previous = {s: signal.signal(s, forward) for s in {signal.SIGTERM, stop}}
    try:
        return process.wait()
    except BaseException:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(pids, ignore_errors=True)


def _read_failures(payload: str, code: int) -> BaseException:
    folder = os.path.join(payload, "errors")
    reports = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            reports.append(pickle.load(f))
    if not reports:
        return TrainingFailedError(
            f"mpiexec exited with status {code} and no rank reported an exception: a rank was "
            "probably killed (by a signal, or the out-of-memory killer); see the output above.")
    reports.sort(key=lambda r: r.failure.rank)
    first = reports[0]
    if not first.training:
        original = first.failure.original()
        if isinstance(original, BaseException):
            return original
    return TrainingFailedError(_comm.describe([r.failure for r in reports], "training"))


@dataclass(frozen=True)
class _ErrorReport:
    failure: _comm.RankFailure
    training: bool


def fail(comm: Any, env: Environment, exc: BaseException, collective: bool,
         training: bool) -> None:
    """End this rank's part in a failed run; the others must not be left waiting.

    An error every rank raised together is raised on each rank. An error of one rank alone
    is logged with its traceback and the whole MPI job is aborted, since the other ranks may
    be blocked in a collective that this rank will never join.
    """
    failure = _comm.RankFailure.capture(comm.rank, exc)
    error = _as_raised(exc, training, collective, comm)
    if env.worker:
        _write_error(env.worker, _ErrorReport(_comm.RankFailure.capture(comm.rank, error), training))
    if collective or comm.size == 1:
        if comm.rank == 0 and not env.worker and training:
            log.error("training failed; to resume, run the same command again: the experiment "
                      "has a manifest, so the run continues from its last committed checkpoint.")
        raise error from exc
    hint = ("" if env.worker else "\nTo resume, run the same command again: the run continues "
            "from its last committed checkpoint.")
    log.error("rank %d failed; aborting all %d ranks.\n%s%s", comm.rank, comm.size,
              failure.traceback.rstrip(), hint)
    for handler in log.handlers:
        handler.flush()
    sys.stderr.flush()
    # MPI_Abort kills at once; give the launcher a moment to forward this rank's output,
    # or the one message that says what failed can be lost.
    time.sleep(ABORT_GRACE)
    _comm.world().Abort(1)


def _as_raised(exc: BaseException, training: bool, collective: bool, comm: Any) -> BaseException:
    """What fit() raises: setup errors as they are, training errors as TrainingFailedError."""
    if not training or isinstance(exc, TrainingFailedError):
        return exc
    if collective and comm.size > 1:
        return TrainingFailedError(
            f"training failed on all {comm.size} ranks: {type(exc).__name__}: {exc}")
    return TrainingFailedError(_comm.describe([_comm.RankFailure.capture(comm.rank, exc)], "training"))


def _write_error(payload: str, report: _ErrorReport) -> None:
    path = os.path.join(payload, "errors", f"rank-{report.failure.rank}.pkl")
    try:
        with open(path + ".tmp", "wb") as f:
            pickle.dump(report, f)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        log.error("could not hand the error to the launching process: %s", exc)


def register_pid(env: Environment) -> None:
    """Let the process that launched this rank send it the stop signal."""
    if env.pid_dir:
        with contextlib.suppress(OSError):
            open(os.path.join(env.pid_dir, str(os.getpid())), "w").close()


def import_main(path: str) -> None:
    """Import the user's script as ``__mp_main__``, stopping at its call of fit()."""
    global importing_main
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    importing_main = True
    try:
        exec(code, module.__dict__)
    except MainImported:
        pass
    finally:
        importing_main = False
ABORT_GRACE = 0.5
