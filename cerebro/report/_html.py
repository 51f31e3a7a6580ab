"""``report.html``: one self-contained page (plotly.js inlined, no network) about a run,
finished or still going. From the top: a headline card (the best trial, its best epoch and
metric, its config, the command that exports it, when the run ran and how its trials
ended); the ranked trials, one column per hyperparameter that varies; then the charts of
:mod:`cerebro.report._figures`."""
from __future__ import annotations

import html
import math
import os
import shlex
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from ..results import NoBestTrialError, Result, flat_config, load
from ..results._trial_result import rounded
from ..store import _files as files
from . import _figures

TABLE_ROWS = 1000     # the report's table of trials: the best ones of a larger run (a row is ~230 bytes)


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> str:
    """Write the report of the run in ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``)
    and return its path. Works on a run that is still going: it shows what is done so far.

    Example:
        >>> cb.report.write_report("runs/exp1")        # or: cerebro report runs/exp1  # doctest: +SKIP
    """
    path = None if out is None else files.check_output(out, "out")
    result = load(run_dir)
    path = path or os.path.join(result.run_dir, "report.html")
    # In place of whatever is there, never through it: a report.html someone made a link must
    # not turn `cerebro report` into a write to the file it names.
    files.write_atomic(path, render(result).encode("utf-8"))
    return path


def render(result: Result) -> str:
    import plotly.offline
    log = _figures.log_keys(result)
    figures = [("Learning curves", "curves", _figures.learning_curves(result)),
               ("Best so far", "best-so-far", _figures.best_so_far(result)),
               ("Hyperparameter importance", "importance", _figures.importance(result, log)),
               ("Workers over time", "gantt", _figures.gantt(result)),
               ("Configurations against the objective", "parallel", _figures.parallel_coordinates(result, log)),
               ("Epochs each trial trained", "rungs", _figures.rungs(result)),
               ("The Pareto front on the first two objectives", "pareto", _figures.pareto_front(result))]
    if len(result.lineage()):
        figures.append(("PBT lineage", "lineage", _figures.lineage(result)))
    sections = []
    for title, name, figure in figures:
        if figure is None:
            continue
        div = figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{name}",
                             config={"displaylogo": False})
        sections.append(f'<section id="{name}"><h2>{html.escape(title)}</h2>{div}</section>')
    front = front_table(result)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Cerebro report</title>"
            f"<style>{_CSS}</style><script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script>"
            f"</head><body>{headline(result)}"
            + (f'<section id="front">{front}</section>' if front else "")
            + f'<section id="trials"><h2>Trials</h2>{trial_table(result, TABLE_ROWS)}</section>'
            f"{''.join(sections)}</body></html>")


def headline(result: Result) -> str:
    """The card at the top: what the run found and how it went."""
    info = result.store.read_run_info()
    status = "finished" if result.finished else "not finished (this page shows what is done so far)"
    counts = Counter(t.status for t in result.trials)
    ended = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda item: -item[1]))
    lines = [f"<h1>Cerebro run <code>{html.escape(result.run_dir)}</code></h1>",
             f"<p>{_text(info['searcher']['class'])}, seed {_text(result.seed)}, {_text(info['workers'])} workers, "
             f"{_text(info['data']['partitions'])} partitions: {status}. {_objectives(result)}.</p>",
             f"<p id='when'>{html.escape(_when(info, result))}</p>",
             f"<p id='counts'>{len(result.trials)} trials: {html.escape(ended or 'none yet')}</p>"]
    try:
        best = result.best      # the one rule: the page, /metrics and `cerebro status` lead with the same trial
    except NoBestTrialError:
        return (f"<div class='card'>{''.join(lines)}<p>No trial that did not fail has a "
                f"{html.escape(result.metric)} yet.</p></div>")
    export = f"cerebro export {shlex.quote(result.run_dir)} --trial {best.trial_id} -o model.safetensors"
    title = "Best" if result.finished else "Best so far"     # an unfinished run's best may still change
    lines.insert(1, f"<p class='best' id='best'>{title}: <b>{html.escape(best.trial_id)}</b> at epoch "
                    f"{_text(best.best_epoch)}: {html.escape(result.metric)} = "
                    f"<b>{_number(best.best_metrics.get(result.metric))}</b>"
                    f"<br><code>{html.escape(rounded(best.config))}</code></p>"
                    f"<p>Export it: <code id='export'>{html.escape(export)}</code></p>")
    return f"<div class='card'>{''.join(lines)}</div>"


def _objectives(result: Result) -> str:
    """``Objective: val_loss (min)``, or with several, all of them and which ranks the trials."""
    named = ", ".join(f"{_text(o.metric)} ({_text(o.mode)})" for o in result.objectives)
    if len(result.objectives) == 1:
        return f"Objective: {named}"
    return f"Objectives: {named}; the first ranks the trials, all of them make the Pareto front"


def front_table(result: Result) -> str:
    """A run with several objectives: its Pareto front (``result.pareto()``), each trial with
    every objective at its best epoch by the first, and its config; "" for one objective."""
    if len(result.objectives) < 2:
        return ""
    front = result.pareto()
    rows = "".join(f"<tr class='front'><td>{_text(t.trial_id)}</td><td>{_text(t.status)}</td>"
                   f"<td>{_text(t.best_epoch)}</td>"
                   + "".join(f"<td>{_count_or_number(t.best_metrics[o.metric])}</td>" for o in result.objectives)
                   + f"<td><code>{html.escape(rounded(t.config))}</code></td></tr>" for t in front)
    head = "".join(f"<th>{_text(o.metric)} ({_text(o.mode)})</th>" for o in result.objectives)
    return (f"<h2>Pareto front</h2><p>{len(front)} trials that no other trial beats on one objective while no "
            f"worse on the others, each at its best epoch by {_text(result.metric)}:</p>"
            f"<table><thead><tr><th>trial</th><th>status</th><th>epoch</th>{head}<th>config</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _when(info: dict[str, Any], result: Result) -> str:
    """``started 2026-11-26 20:59; its sub-epochs span 0:01:12`` (the time a resume waited
    for is not in the schedule's clock, so no end date is made up from it)."""
    schedule = result.schedule()
    span = f"its sub-epochs span {timedelta(seconds=round(float(schedule.end.max() - schedule.start.min())))}" \
        if not schedule.empty else "no sub-epoch has run yet"
    try:
        started = datetime.strptime(info["created"], "%Y-%m-%dT%H:%M:%S%z")
    except (KeyError, ValueError):
        return span
    return f"started {started:%Y-%m-%d %H:%M}; {span}"


def trial_table(result: Result, top: int | None = None) -> str:
    """Trials ranked by the objective at their best epoch: status, best and final metric, one
    rounded column per hyperparameter that varies (those every trial shares listed above);
    ``top``: the best ``top`` alone, saying so (None: every one)."""
    configs = {t.trial_id: flat_config(t.config) for t in result.trials}
    keys = list(dict.fromkeys(k for config in configs.values() for k in config))
    shared = {k: next(iter(configs.values()))[k] for k in keys
              if all(k in c for c in configs.values()) and len({repr(c[k]) for c in configs.values()}) == 1}
    varying = [k for k in keys if k not in shared]
    rows = []
    ranked = result.ranked()
    for trial in ranked[:top]:
        best = trial.best_metrics.get(result.metric, math.nan)
        cells = "".join(f"<td>{html.escape(_value(configs[trial.trial_id].get(k)))}</td>" for k in varying)
        why = (trial.reason or "").strip().splitlines()[-1] if trial.reason else ""
        rows.append(f"<tr class='status-{html.escape(str(trial.status))}'><td>{html.escape(trial.trial_id)}</td>"
                    f"<td>{html.escape(str(trial.status))}</td>"
                    f"<td>{_text(trial.epochs)}</td><td>{_text(_value(trial.best_epoch))}</td>"
                    f"<td>{_number(best)}</td><td>{_number(trial.metrics.get(result.metric, math.nan))}</td>"
                    f"{cells}<td>{html.escape(why)}</td></tr>")
    head = "".join(f"<th>{html.escape(k)}</th>" for k in varying)
    same = f"<p id='shared'>Every trial: <code>{html.escape(rounded(shared))}</code></p>" if shared else ""
    if top is not None and len(ranked) > top:
        same += (f"<p id='shown'>The best {top:,} of {len(ranked):,} trials; <code>cerebro status "
                 f"{html.escape(shlex.quote(result.run_dir))} --all</code> lists every one.</p>")
    metric = html.escape(result.metric)
    # In a box of its own height at most: a long table scrolls there, the charts stay near the top.
    return (f"{same}<div class='rows'><table><thead><tr><th>trial</th><th>status</th><th>epochs</th>"
            f"<th>best epoch</th><th>best {metric}</th><th>final {metric}</th>{head}<th>why it ended</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _text(value: Any) -> str:
    """``value`` as HTML text: what a run directory says is data, never markup."""
    return html.escape(str(value))


def _value(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _count_or_number(value: float) -> str:
    """A whole number (a parameter count) as one, else as :func:`_number`."""
    return str(int(value)) if float(value).is_integer() else _number(value)


def _number(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left}
code{font-size:12px}tr.status-failed,tr.status-diverged,tr.status-timeout{color:#9b2226}section{margin-top:28px}
.card{border:1px solid #ccc;border-radius:8px;padding:4px 20px 12px;background:#f8f9fa}.card h1{font-size:22px}
.best{font-size:17px}.rows{max-height:600px;overflow-y:auto}.rows th{position:sticky;top:0;background:#fff}"""
