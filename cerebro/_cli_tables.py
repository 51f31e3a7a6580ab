"""What ``cerebro`` prints: the ranked trials of a run, one trial in full, and a warning in one line."""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import click
from rich import box
from rich.console import Console, OverflowMethod
from rich.table import Table

from .results import Result
from .results._run_state import RunState
from .results._trial_result import rounded


def print_summary(result: Result, console: Console, top: int | None = None) -> None:
    """The trials ranked by the run's metric at their best epoch, as a table that fits the
    console: configs' numbers to 4 significant digits (0.001 and 0.005 stay apart), the
    settings every trial shares on a line above it, a long reason cut short, and where it
    still does not fit, the least telling columns left out, saying which. ``top``: the best
    ``top`` trials alone (None: every one), with the count of each status, so that a run of
    10,000 trials fits a screen."""
    if not result.trials:       # a run that has not begun one (or failed first): its state says so
        return
    columns, shared = _summary_columns(result, top)
    if shared:
        console.print(f"every trial: {rounded(shared)}", highlight=False, soft_wrap=True)
    reason = next((c for c in columns if c.name == "reason"), None)
    whole, left_out = reason.width if reason is not None else 0, []
    while _width(columns, reason, whole, console.width) > console.width and \
            any(c.drop_order is not None for c in columns):
        dropped = min((c for c in columns if c.drop_order is not None), key=lambda c: c.drop_order or 0)
        columns.remove(dropped)
        left_out.append(dropped.header)
    table = Table(title=f"trials ranked by their best {result.metric} ({result.mode})", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for column in columns:
        table.add_column(column.header, width=column.width, no_wrap=column.name == "reason", overflow=column.overflow,
                         justify="left" if column.name in ("trial_id", "status", "reason") else "right")
    for row in zip(*(column.cells for column in columns)):
        table.add_row(*row)
    console.print(table)
    if top is not None and len(result.trials) > top:
        statuses = Counter(str(t.status) for t in result.trials)
        console.print(f"the best {top} of {len(result.trials):,} trials ("
                      + ", ".join(f"{n:,} {s}" for s, n in statuses.most_common())
                      + "); --all shows every one", highlight=False, soft_wrap=True)
    if left_out:
        console.print(f"(left out to fit {console.width} columns: {', '.join(left_out)}; --trial ID shows one "
                      f"in full)", highlight=False, soft_wrap=True)


_REASON_WIDTH = 10      # the least of a reason worth showing
_HEADER_WORD = 12       # a config's name's word longer than this folds rather than widening its column
_LAST_CONFIG = 1000     # configs are left out after every other column that may be, the rightmost first


@dataclass
class _Column:
    """One column of the summary table: its name in ``result.summary()``, its header, its cells
    as text, its width, and when it is left out where the table does not fit (None: never;
    lower first)."""

    name: str
    header: str
    cells: list[str]
    width: int
    drop_order: int | None
    overflow: OverflowMethod = "fold"


def _width(columns: list[_Column], reason: _Column | None, whole: int, room: int) -> int:
    """The table's width once the ``reason`` column (``whole`` wide at most) takes the room
    the others leave of ``room``, cut short with an ellipsis, but never below a few
    characters: its columns, a space either side of each but at the edges, the (blank) line
    between two columns and the (blank) edges."""
    def width() -> int:
        return sum(c.width for c in columns) + 3 * (len(columns) - 1) + 2
    if reason is not None and reason in columns:
        reason.width = max(_REASON_WIDTH, min(whole, room - (width() - reason.width)))
    return width()


def _summary_columns(result: Result, top: int | None = None) -> tuple[list[_Column], dict[str, Any]]:
    """The summary's columns as text (of the best ``top`` trials; None: every one), and the
    config values every trial shown shares (left out)."""
    # Rows, not result.summary()'s DataFrame: status need not import pandas (0.4 s of its 2).
    rows, metric = result.summary_rows(top), result.metric
    names = list(dict.fromkeys(name for row in rows for name in row))   # as a DataFrame of them orders its columns
    if "best_epoch" in names and all(row["best_epoch"] is None for row in rows):
        names = [n for n in names if n not in ("best_epoch", f"best_{metric}")]     # no epoch ended yet
    if "reason" in names and all(row["reason"] is None for row in rows):
        names.remove("reason")                       # no trial stopped early or failed
    elif "reason" in names:                          # a traceback in one line: the exception it ends in
        trials = {t.trial_id: t for t in result.trials}
        rows = [{**row, "reason": trials[row["trial_id"]].cause} for row in rows]
    ranked = "best_epoch" in names
    headers = {"trial_id": "trial", "best_epoch": "at epoch", f"best_{metric}": "best",
               metric: "last" if ranked else metric, "reason": "why it ended"}
    # Left out first where the table does not fit: the last epoch's metric, the epoch counts.
    order = {metric: 0, "epochs": 1, "best_epoch": 2, "reason": 3} if ranked else {"epochs": 1, "reason": 3}
    config = [c for c in names if c not in headers and c not in ("status", "epochs")]
    shared = {c: rows[0].get(c) for c in config if len(rows) > 1 and len({repr(row.get(c)) for row in rows}) == 1}
    columns: list[_Column] = []
    for name in names:
        if name in shared:
            continue
        cells = [_cell(row.get(name), name in config) for row in rows]
        # A config's name breaks after its underscores ("batch_" over "size"), not inside a word.
        header = headers.get(name, "_\n".join(str(name).split("_")) if name in config else str(name))
        words = max(len(word) for word in header.split())
        width = max([len(cell) for cell in cells] + [min(words, _HEADER_WORD) if name in config else words])
        drop = _LAST_CONFIG - len(columns) if name in config else order.get(name)     # configs: rightmost first
        columns.append(_Column(name, header, cells, width, drop, "ellipsis" if name == "reason" else "fold"))
    return columns, shared


def _cell(value: Any, config: bool) -> str:
    """A config's float to 4 significant digits, a metric's to 4 decimals (3 significant digits
    below 0.001, where decimals would show 0.0000), nothing for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}" if config else f"{value:.4f}" if abs(value) >= 1e-3 else f"{value:.3g}"
    return str(value)


def print_front(result: Result, console: Console) -> None:
    """A run with several objectives: its Pareto front (``result.pareto()``) as a table, each
    trial with every objective at its best epoch by the first; nothing for one objective."""
    if len(result.objectives) < 2 or not result.trials:
        return
    front, named = result.pareto(), ", ".join(f"{o.metric} ({o.mode})" for o in result.objectives)
    if not front:
        console.print(f"Pareto front on {named}: no trial has a value of each yet", highlight=False, markup=False)
        return
    table = Table(title=f"Pareto front on {named}: {len(front)} trials, each at its best epoch by {result.metric}",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("trial", "status", "at epoch", *(o.metric for o in result.objectives), "config"):
        table.add_column(header, justify="left" if header in ("trial", "status", "config") else "right",
                         overflow="fold")
    for trial in front:
        table.add_row(trial.trial_id, str(trial.status), str(trial.best_epoch),
                      *(_cell(_whole(trial.best_metrics[o.metric]), False) for o in result.objectives),
                      rounded(trial.config))
    console.print(table)


def _whole(value: float) -> float | int:
    """A whole number (a parameter count) as an int, so it shows without a fraction."""
    return int(value) if float(value).is_integer() else value


def print_state(result: Result, console: Console) -> None:
    """Where the run stands, in one line (the driver's error after it, where it failed): how
    many trials ended, where the others are, and what goes on with the run."""
    trials = result.trials
    done = sum(t.status.is_finished for t in trials)
    waiting = Counter(str(t.status) for t in trials if not t.status.is_finished)
    counts = f"{done} of {len(trials)} trials ended" + "".join(f", {n} {s}" for s, n in sorted(waiting.items()))
    resume = f"`cerebro resume {result.run_dir}` goes on"
    state = result.state
    if state is RunState.FAILED:
        first = "failed before its first trial began" if not trials else f"failed: {counts}"
        line = f"{first}; once its driver's error is dealt with, {resume}:\n  {(result.run_error or '').strip()}"
    else:
        line = {RunState.FINISHED: f"finished: {counts}", RunState.RUNNING: f"running: {counts}",
                RunState.STOPPED: f"stopped by cerebro stop: {counts}; {resume}",
                RunState.BUDGET: f"stopped by its time_budget: {counts}; {resume}",
                RunState.INTERRUPTED: f"interrupted (Ctrl-C or SIGTERM): {counts}; {resume}",
                RunState.DIED: f"not finished: its driver died (killed, or out of memory?): {counts}; {resume}"}[state]
    console.print(line, highlight=False, soft_wrap=True, markup=False)


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
