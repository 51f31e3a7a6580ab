"""``cerebro`` on the command line: demo, run, status, resume, report, export."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import runpy
import secrets
import sys
import time
import warnings
from typing import NoReturn

import click
from rich.console import Console

from ._checks import quoted, shortened
from ._cli_dashboard import dashboard, metrics_options
from ._cli_serve import export, predict_command
from ._cli_sql import sql
from ._cli_tables import print_front, print_state, print_summary, print_trial, show_warning
from .results import Result, load

TOP = 20      # trials a status or a run's summary shows: a screen, whatever the run's size


def exit_if_failed(result: Result) -> None:
    """Exit 1, saying why, when every trial of the run failed."""
    if result.failure is not None:     # fit logged it in full; its first line is enough here
        click.echo(f"the run failed: {result.failure.splitlines()[0]}", err=True)
        sys.exit(1)


def _interrupted(error: BaseException | None) -> None:
    """One line, no traceback: a run under way (InterruptedRun) says how to finish it. Then
    exit 1 at once: the run has closed its workers and files, and after a handled Ctrl-C
    the interpreter's own exit sometimes ended the process by SIGINT instead (1 in 6 tries)."""
    click.echo(str(error) if getattr(error, "run_dir", None) else "interrupted", err=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


@click.group(epilog="""\b
Examples:
  cerebro demo                                  a real model selection on bundled digits
  cerebro run experiment.py --workers 4 --store runs/exp1 --seed 0
  cerebro status runs/exp1                      where a run stands, live or finished
  cerebro status runs/exp1 --trial t0003        one trial, its whole error included
  cerebro report runs/exp1                      runs/exp1/report.html, opens offline
  cerebro resume runs/exp1                      finish a run whose driver died (or that stopped)
  cerebro resume runs/exp1 --epochs 20          train a finished grid, random or PBT run on to 20 epochs
  cerebro stop runs/exp1                        a live run stops at its next epoch boundaries, resumable
  cerebro stop runs/exp1 --trial t0003          one trial of a live run ends, the others go on
  cerebro add runs/exp1 --config '{"lr": 0.01}' a trial more in a live grid or random search
  cerebro export runs/exp1 --trial best -o model.safetensors
  cerebro predict runs/exp1 test.parquet -o predictions.parquet --top-k 3
  cerebro sql install --dsn postgresql:///mydb  the SQL functions (MADlib's API) in PostgreSQL

Exit codes: 0 success, 1 the run failed or was interrupted, 2 bad usage or bad input.""")
def main() -> None:
    """Cerebro: deep-learning model selection with Model Hopper Parallelism (MOP).

    The data is partitioned over the workers and never moves; every model trains on one
    worker's partition for a sub-epoch, then hops to the next worker. A run lives in one run
    directory (the store): its journal, checkpoints, history and schedule.
    """


def entry() -> None:
    """The ``cerebro`` command: ``main`` with the exit codes of its help."""
    from ._extras import missing_extra
    warnings.showwarning = show_warning
    try:
        try:
            main(standalone_mode=False)
        except ModuleNotFoundError as error:     # a package of an extra, imported where it was needed
            extra = missing_extra(error)
            if extra is None:
                raise
            raise extra from None
    except click.exceptions.Abort as error:      # click's form of a KeyboardInterrupt
        _interrupted(error.__cause__)
    except click.ClickException as error:
        setattr(error, "message", capped(error.message))      # noqa: B010 (click types it Final; it is the message shown)
        error.show()
        sys.exit(2)
    except KeyboardInterrupt as error:
        _interrupted(error)
    except Exception as error:      # noqa: BLE001 (those of no kind below are raised again)
        _exit_for(error)


_LONG_RUN = re.compile(r"\S{1001,}")     # longer than any path a message names


def capped(message: str) -> str:
    """``message`` with every run of over 1,000 characters without a space cut short: an
    argument of 100 KB is named by its start and length, not echoed whole (click's own
    messages quote what they refuse, as do many of Cerebro's).

    >>> capped("'" + "x" * 2000 + "' is not one of 'torch', 'keras'.")[-60:]
    "xxxxxxx... (2002 characters) is not one of 'torch', 'keras'."
    """
    return _LONG_RUN.sub(lambda run: shortened(run.group(0)), message)


# A path given that cannot be one, or cannot be written: bad input, not a traceback.
_BAD_PATH = {errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EROFS}


def _exit_for(error: Exception) -> NoReturn:
    """Exit saying why: 1 for a run that failed, 2 for bad input; raise again an error of
    neither kind. The engine's errors are imported once one got here: importing the engine
    (and torch with it) first would cost every command a second, ``cerebro status`` too."""
    from ._extras import MissingExtraError
    from .engine import ResumeError, StoreWriteError, TooManyFailuresError, WorkerLostError
    from .results import NoBestTrialError
    from .store import StoreInUseError, TrustKeyError, UntrustedCodeError, UntrustedStateError
    if isinstance(error, (WorkerLostError, TooManyFailuresError, ResumeError, StoreWriteError, StoreInUseError)):
        click.echo(f"the run failed: {capped(str(error))}", err=True)
        sys.exit(1)
    if isinstance(error, (TimeoutError, NoBestTrialError)):    # a live run's driver did not take a command; no winner
        click.echo(f"error: {capped(str(error))}", err=True)
        sys.exit(1)
    if isinstance(error, (ValueError, TypeError, FileNotFoundError, FileExistsError, UntrustedStateError,
                          UntrustedCodeError, TrustKeyError, MissingExtraError)) or \
            isinstance(error, OSError) and error.errno in _BAD_PATH:
        click.echo(f"error: {capped(str(error))}", err=True)
        sys.exit(2)
    raise error


@main.command()
@click.option("--workers", default=2, show_default=True, help="local worker processes")
@click.option("--epochs", default=10, show_default=True, help="epochs per trial")
@click.option("--store", default=None, help="run directory (default: ./cerebro_runs/demo-<time>)")
@click.option("--seed", default=0, show_default=True)
@click.option("--framework", type=click.Choice(["torch", "keras"]), default="torch", show_default=True,
              help="keras: the same models in Keras 3, on the backend KERAS_BACKEND names")
def demo(workers: int, epochs: int, store: str | None, seed: int, framework: str) -> None:
    """Select among 8 MLP/CNN configurations on the bundled 8x8 digits (about 30 s on 2 cores).

    Example: cerebro demo --workers 2 --epochs 10
    """
    from . import demo as demo_module
    try:
        search = demo_module.search(epochs, framework)
    except ImportError as error:
        raise click.ClickException(str(error)) from None
    if store is None:
        store = os.path.join("cerebro_runs", f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
    result = search.fit(demo_module.load_data(), workers=workers, store=store, seed=seed)
    console = Console()
    print_summary(result, console)
    exit_if_failed(result)
    best = result.best
    console.print(f"best: {best.trial_id} {best.config} epoch {best.best_epoch}: "
                  f"{result.metric}={best.best_metrics[result.metric]:.4f}")


@main.command()
@click.argument("experiment", type=click.Path(exists=True, dir_okay=False))
@click.option("--workers", default=2, show_default=True, help="workers (local processes, Spark tasks, Ray actors, ...)")
@click.option("--backend", type=click.Choice(["local", "spark", "ray", "dask"]), default="local", show_default=True,
              help="spark: one-task jobs on the SparkSession that getOrCreate finds; ray: actors on the Ray "
                   "cluster ray.init finds (RAY_ADDRESS, or one `ray start` made here; else a new local one); "
                   "dask: tasks on the scheduler at DASK_SCHEDULER_ADDRESS (else a new LocalCluster)")
@click.option("--store", default=None, help="run directory (default: ./cerebro_runs/<searcher>-<time>)")
@click.option("--seed", default=None, type=int, help="the run's seed (default: drawn and recorded)")
@click.option("--trial-timeout", default=None, type=float, help="seconds one sub-epoch of a trial may take")
@click.option("--hang-after", default=300.0, show_default=True, type=float,
              help="seconds a sub-epoch may begin no batch (and 10x its trial's longest wait) before it is taken "
                   "to hang; 0: never")
@click.option("--max-failures", default=None, type=int, help="stop the run when more trials fail")
@click.option("--max-trial-losses", default=3, show_default=True, type=int,
              help="a trial on this many lost workers fails as their cause")
@click.option("--mlflow", default=None, help="'local' for RUN_DIR/mlflow.db, or a tracking URI")
@click.option("--time-budget", default=None, type=float,
              help="seconds; then the run stops at its trials' next epoch boundaries, resumable")
@metrics_options
@click.option("--quiet", is_flag=True, help="no live progress")
def run(experiment: str, workers: int, backend: str, store: str | None, seed: int | None,
        trial_timeout: float | None, hang_after: float, max_failures: int | None, max_trial_losses: int,
        mlflow: str | None, time_budget: float | None, metrics_port: int | None, metrics_host: str,
        quiet: bool) -> None:
    """Run the searcher that EXPERIMENT (a Python file) defines.

    The file defines ``data`` (a cb.Dataset) and ``search`` (a searcher such as
    cb.GridSearch(build, space, epochs=5)); this command says how to run it.

    \b
    Example experiment.py (it runs as written):
      import torch
      from sklearn.datasets import load_digits
      import cerebro as cb

    \b
      X, y = load_digits(return_X_y=True)
      data = cb.Dataset.from_numpy(X.astype("float32") / 16, y, partitions=4)

    \b
      def build(config):
          model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
          return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                                   torch.nn.functional.cross_entropy, batch_size=32,
                                   metrics={"accuracy": cb.metrics.accuracy})

    \b
      search = cb.ASHA(build, {"lr": cb.loguniform(1e-3, 1e-1)}, num_trials=16, max_epochs=9,
                       metric="val_accuracy", mode="max")
    """
    from . import Backend, DaskBackend, Dataset, RayBackend, SparkBackend
    from .search import Searcher
    names = runpy.run_path(experiment, run_name="cerebro_experiment")
    data, search = names.get("data"), names.get("search")
    if not isinstance(data, Dataset) or not isinstance(search, Searcher):
        raise click.UsageError(f"{experiment} must define `data` (a cb.Dataset) and `search` (a searcher such as "
                               f"cb.GridSearch); it defines data={type(data).__name__}, "
                               f"search={type(search).__name__}")
    if backend == "spark":
        from pyspark.sql import SparkSession
        chosen: str | Backend = SparkBackend(SparkSession.builder.getOrCreate(), workers=workers)
        workers_arg = None
    elif backend == "ray":
        chosen, workers_arg = RayBackend(workers=workers), None
    elif backend == "dask":
        from distributed import Client
        chosen, workers_arg = DaskBackend(Client(), workers=workers), None
    else:
        chosen, workers_arg = "local", workers
    result = search.fit(data, backend=chosen, workers=workers_arg, store=store, seed=seed, verbose=0 if quiet else 1,
                        trial_timeout=trial_timeout, max_failures=max_failures, max_trial_losses=max_trial_losses,
                        time_budget=time_budget, hang_after=hang_after or None, metrics_port=metrics_port,
                        metrics_host=metrics_host,
                        mlflow=False if mlflow is None else (True if mlflow == "local" else mlflow))
    print_summary(result, Console(), TOP)
    exit_if_failed(result)


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--trial", default=None, help="show this trial alone, its whole error included (e.g. t0003, or best)")
@click.option("--top", default=TOP, show_default=True, type=click.IntRange(min=1), help="the best trials shown")
@click.option("--all", "every", is_flag=True, help="show every trial, not only the best --top")
def status(run_dir: str, trial: str | None, top: int, every: bool) -> None:
    """Show where a run stands, live or finished: its best trials, their status and metrics
    (a failed trial's error in one line: --trial ID shows all of it), and how many trials
    ended each way.

    Example: cerebro status runs/exp1 --trial t0003
    """
    result = load(run_dir)
    if trial is not None:
        print_trial(result, trial)
        return
    console = Console()
    print_state(result, console)
    incidents = result.incidents     # read with the rest of the journal
    if incidents["worker_lost"]:
        console.print(f"workers: {incidents['worker_lost']} lost, {incidents['worker_replaced']} started anew"
                      + (f" ({incidents['worker_not_replaced']} could not be)" if incidents["worker_not_replaced"]
                         else "") + f", all restarted {incidents['workers_restarted']} times")
    if incidents["state_lost"]:
        console.print(f"trial states lost with their workers and recomputed: {incidents['state_lost']}")
    print_summary(result, console, None if every else top)
    print_front(result, console)


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--trial", default=None, help="stop only this trial (e.g. t0003), at its epoch end; the others go on")
def stop(run_dir: str, trial: str | None) -> None:
    """Ask a live run to stop: it starts no new trial or epoch, lets the epochs in flight end,
    and stays resumable (cerebro resume RUN_DIR goes on to the same results). With --trial,
    that trial alone ends, stopped by the user.

    Example: cerebro stop runs/exp1 --trial t0003
    """
    from . import stop as stop_run
    stop_run(run_dir, trial=trial)
    click.echo(f"asked {run_dir} to stop at its trials' next epoch boundaries" if trial is None
               else f"{trial} ends stopped at its epoch end; the other trials go on")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--config", "config_json", required=True, help="the trial's config as JSON, with every key of the space")
def add(run_dir: str, config_json: str) -> None:
    """Add a trial to a live grid or random search; prints its id.

    Example: cerebro add runs/exp1 --config '{"lr": 0.005, "hidden": 64}'
    """

    from . import add_trial
    try:
        config = json.loads(config_json)
    except ValueError as error:
        raise click.BadParameter(f"{quoted(config_json)} is not JSON: {error}", param_hint="--config") from None
    click.echo(add_trial(run_dir, config))


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--workers", default=None, type=int, help="local worker processes (default: as the run had)")
@click.option("--quiet", is_flag=True, help="no live progress")
@click.option("--trust", is_flag=True,
              help="load a run's code though no run of yours signed it, and older versions' pickled states")
@click.option("--retry-failed", is_flag=True, help="run the trials that failed again, from their last good epoch")
@click.option("--epochs", default=None, type=click.IntRange(min=1),
              help="train a grid, random or PBT run on to this many epochs (as if it had had them from the start)")
@metrics_options
def resume(run_dir: str, workers: int | None, quiet: bool, trust: bool, retry_failed: bool,
           epochs: int | None, metrics_port: int | None, metrics_host: str) -> None:
    """Finish a run whose driver died (killed, crashed, Ctrl-C), from its journal and
    checkpoints; the results are those the run would have had without the crash. With
    --epochs, extend a finished grid, random or PBT run: its trials train on to that many
    epochs.

    Example: cerebro resume cerebro_runs/gridsearch-20261122-101500-ab12 --epochs 20
    """
    from . import resume as resume_run
    result = resume_run(run_dir, workers=workers, verbose=0 if quiet else 1, trust=trust, retry_failed=retry_failed,
                        epochs=epochs, metrics_port=metrics_port, metrics_host=metrics_host)
    print_summary(result, Console(), TOP)
    exit_if_failed(result)


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", default=None, help="where to write the page (default: RUN_DIR/report.html)")
def report(run_dir: str, out: str | None) -> None:
    """Write one self-contained HTML page about a run, finished or still going: ranked
    trials, learning curves, a Gantt chart of sub-epochs on workers with the utilization,
    configurations against the objective, rungs or PBT lineage. Opens without network.

    Example: cerebro report cerebro_runs/demo-20261122-101500-ab12 -o report.html
    """
    from .report import write_report
    click.echo(write_report(run_dir, out))


main.add_command(dashboard)
main.add_command(predict_command)
main.add_command(export)
main.add_command(sql)
