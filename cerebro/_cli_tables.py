"""What ``cerebro`` prints: the ranked trials of a run, one trial in full, and a warning in one line."""
from __future__ import annotations

import json
import math
from typing import Any

import click
import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from .report import Result


def print_summary(result: Result, console: Console) -> None:
    """The trials ranked by the run's metric at their best epoch, as a table (with the last
    epoch's beside it)."""
    summary = result.summary()
    if "best_epoch" in summary and summary.best_epoch.isna().all():
        summary = summary.drop(columns=["best_epoch", f"best_{result.metric}"])     # no epoch ended yet
    if "reason" in summary and summary.reason.isna().all():
        summary = summary.drop(columns="reason")     # no trial stopped early or failed
    elif "reason" in summary:                        # a traceback in one line: the exception it ends in
        causes = {t.trial_id: t.cause for t in result.trials}
        summary["reason"] = [causes[trial_id] for trial_id in summary.trial_id]
    table = Table(title=f"trials ranked by their best {result.metric} ({result.mode})", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for column in summary.columns:
        table.add_column(str(column), justify="left" if column in ("trial_id", "status") else "right")
    for row in summary.itertuples(index=False):
        table.add_row(*("" if v is None or v is pd.NA else f"{v:.4f}" if isinstance(v, float) and not math.isnan(v)
                        and not v.is_integer() else str(v) for v in row))
    console.print(table)


def print_trial(result: Result, trial_id: str) -> None:
    """One trial: its status, config, epochs, best and last metrics, and its whole reason
    (a failed trial's traceback), as plain lines that no terminal width wraps."""
    trials = {t.trial_id: t for t in result.trials}
    if trial_id == "best":          # as export and predict take it
        trial_id = result.best.trial_id
    if trial_id not in trials:
        raise click.BadParameter(f"{trial_id!r} is not a trial of {result.run_dir}; its trials are "
                                 f"{', '.join(sorted(trials)) or 'none yet'}", param_hint="--trial")
    trial = trials[trial_id]
    click.echo(f"{trial.trial_id} {trial.status} after {trial.epochs} epochs")
    click.echo(f"config: {json.dumps(trial.config, sort_keys=True, default=str)}")
    if trial.best_epoch is not None:
        click.echo(f"best epoch {trial.best_epoch}: {_metrics(trial.best_metrics)}")
    if trial.metrics:
        click.echo(f"last epoch: {_metrics(trial.metrics)}")
    if trial.reason:
        click.echo(f"{'error' if trial.error else 'reason'}:\n{trial.reason.rstrip()}")


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4f}" if isinstance(v, float) and not math.isnan(v) else f"{k}={v}"
                     for k, v in metrics.items())


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """A warning on the command line: one line saying what, not where in Cerebro's source."""
    click.echo(f"warning: {message}", err=True)
