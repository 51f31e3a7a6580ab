"""``report.html``: one self-contained page (plotly.js inlined, no network) about a run,
finished or still going: the ranked trials, learning curves, the Gantt chart of sub-epochs
on workers with the utilization, configurations against the objective, and the rungs or
the PBT lineage of adaptive searchers."""
from __future__ import annotations

import html
import json
import math
import os
from typing import Any

import pandas as pd

from ._result import Result, load
from ._trial_result import flat_config

STATUS_COLORS = {"completed": "#2a9d8f", "stopped": "#e9c46a", "failed": "#e76f51", "diverged": "#9b2226",
                 "timeout": "#6d597a", "running": "#457b9d"}


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> str:
    """Write the report of the run in ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``)
    and return its path. Works on a run that is still going: it shows what is done so far.

    Example:
        >>> cb.report.write_report("runs/exp1")        # or: cerebro report runs/exp1  # doctest: +SKIP
    """
    result = load(run_dir)
    path = os.fspath(out) if out is not None else os.path.join(result.run_dir, "report.html")
    page = render(result)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def render(result: Result) -> str:
    import plotly.offline
    figures = [("Learning curves", "curves", learning_curves(result)),
               ("Workers over time", "gantt", gantt(result)),
               ("Configurations against the objective", "parallel", parallel_coordinates(result)),
               ("Epochs each trial trained", "rungs", rungs(result))]
    if len(result.lineage()):
        figures.append(("PBT lineage", "lineage", lineage(result)))
    sections = []
    for title, name, figure in figures:
        if figure is None:
            continue
        div = figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{name}",
                             config={"displaylogo": False})
        sections.append(f'<section id="{name}"><h2>{html.escape(title)}</h2>{div}</section>')
    info = result.store.read_run_info()
    status = "finished" if result.finished else "not finished (this page shows what is done so far)"
    header = (f"<h1>Cerebro run <code>{html.escape(result.run_dir)}</code></h1>"
              f"<p>{html.escape(info['searcher']['class'])}, seed {result.seed}, {len(result.trials)} trials, "
              f"{info['workers']} workers, {info['data']['partitions']} partitions: {status}. "
              f"Objective: {html.escape(result.metric)} ({result.mode}).</p>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Cerebro report</title>"
            f"<style>{_CSS}</style><script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script>"
            f'</head><body>{header}<section id="trials"><h2>Trials</h2>{trial_table(result)}</section>'
            f"{''.join(sections)}</body></html>")


def trial_table(result: Result) -> str:
    """Trials ranked by the objective at their best epoch: config, status, best and final metric."""
    rows = []
    for trial in result.ranked():
        best = trial.best_metrics.get(result.metric, math.nan)
        rows.append(f"<tr class='status-{trial.status}'><td>{trial.trial_id}</td><td>{trial.status}</td>"
                    f"<td>{trial.epochs}</td><td>{'' if trial.best_epoch is None else trial.best_epoch}</td>"
                    f"<td>{_number(best)}</td>"
                    f"<td>{_number(trial.metrics.get(result.metric, math.nan))}</td>"
                    f"<td><code>{html.escape(json.dumps(trial.config))}</code></td>"
                    f"<td>{html.escape((trial.reason or '').strip().splitlines()[-1] if trial.reason else '')}</td>"
                    f"</tr>")
    return (f"<table><thead><tr><th>trial</th><th>status</th><th>epochs</th><th>best epoch</th>"
            f"<th>best {result.metric}</th>"
            f"<th>final {result.metric}</th><th>config</th><th>why it ended</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def learning_curves(result: Result) -> Any:
    """Train and validation loss, the objective and, where a schedule changed it, the
    learning rate per epoch; the best trial highlighted; buttons show the trials of one
    status only."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    history = result.history()
    if history.empty:
        return None
    panels = [c for c in ("train_loss", "val_loss") if c in history]
    if result.metric not in panels:
        panels.append(result.metric)
    if "train_lr" in history and history["train_lr"].nunique() > 1:
        panels.append("train_lr")
    figure = make_subplots(rows=1, cols=len(panels), subplot_titles=panels)
    try:
        best = result.best.trial_id
    except RuntimeError:
        best = None
    statuses = []
    for trial in result.trials:
        rows = history[history.trial_id == trial.trial_id]
        for column, panel in enumerate(panels, start=1):
            highlight = trial.trial_id == best
            figure.add_trace(go.Scatter(
                x=rows.epoch, y=rows[panel], mode="lines+markers", name=f"{trial.trial_id} ({trial.status})",
                legendgroup=trial.trial_id, showlegend=column == 1,
                line={"width": 4 if highlight else 1.2,
                      "color": "#d62828" if highlight else STATUS_COLORS.get(trial.status, "#888")},
                opacity=1.0 if highlight else 0.6, hovertext=json.dumps(trial.config)), row=1, col=column)
            statuses.append(trial.status)
    buttons = [{"label": "all", "method": "restyle", "args": [{"visible": [True] * len(statuses)}]}]
    for status in sorted(set(statuses)):
        buttons.append({"label": status, "method": "restyle",
                        "args": [{"visible": [s == status for s in statuses]}]})
    figure.update_layout(height=460, margin={"t": 110}, legend={"font": {"size": 9}},
                         updatemenus=[{"buttons": buttons, "direction": "right", "x": 0, "y": 1.32,
                                       "xanchor": "left", "type": "buttons"}])
    figure.update_xaxes(title_text="epoch")
    return figure


def utilization(schedule: pd.DataFrame, workers: int) -> float:
    """Busy time / (workers × the span from the first sub-epoch to the last)."""
    if schedule.empty:
        return math.nan
    span = schedule.end.max() - schedule.start.min()
    return float((schedule.end - schedule.start).sum() / (workers * span)) if span > 0 else math.nan


def gantt(result: Result) -> Any:
    """One bar per sub-epoch on its worker's row, coloured by trial; eval sub-epochs paler."""
    import plotly.graph_objects as go
    schedule = result.schedule()
    if schedule.empty:
        return None
    workers = result.store.read_run_info()["workers"]
    figure = go.Figure()
    palette = ["#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51", "#457b9d", "#8338ec", "#ff006e",
               "#3a86ff", "#fb5607", "#06d6a0", "#118ab2"]
    for index, (trial_id, rows) in enumerate(schedule.groupby("trial_id", sort=True)):
        figure.add_trace(go.Bar(
            base=rows.start, x=rows.end - rows.start, y=[f"worker {w}" for w in rows.worker], orientation="h",
            name=trial_id, marker={"color": palette[index % len(palette)],
                                   "opacity": [1.0 if k == "train" else 0.45 for k in rows.kind]},
            customdata=list(zip(rows.kind, rows.epoch, rows.partition)),
            hovertemplate="%{fullData.name} %{customdata[0]} epoch %{customdata[1]} partition %{customdata[2]}"
                          "<br>%{base:.2f} s + %{x:.3f} s<extra></extra>"))
    figure.update_layout(barmode="overlay", height=160 + 40 * workers, xaxis_title="seconds since the run started",
                         title=f"utilization {utilization(schedule, workers):.3f} (busy / (workers × span)); "
                               f"{len(schedule)} sub-epochs, eval paler", showlegend=len(result.trials) <= 40)
    return figure


def parallel_coordinates(result: Result) -> Any:
    """Every trial's configuration and last value of the objective."""
    import plotly.graph_objects as go
    scored = [t for t in result.trials if isinstance(t.metrics.get(result.metric), (int, float))
              and math.isfinite(t.metrics[result.metric])]
    if not scored:
        return None
    dimensions = []
    configs = [flat_config(t.config) for t in scored]
    for key in dict.fromkeys(k for config in configs for k in config):     # every branch's keys
        values = [config.get(key) for config in configs]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            dimensions.append({"label": key, "values": values})
        else:
            labels = sorted({json.dumps(v) for v in values})
            dimensions.append({"label": key, "values": [labels.index(json.dumps(v)) for v in values],
                               "tickvals": list(range(len(labels))), "ticktext": labels})
    objective = [t.metrics[result.metric] for t in scored]
    dimensions.append({"label": result.metric, "values": objective})
    figure = go.Figure(go.Parcoords(line={"color": objective, "colorscale": "Viridis", "showscale": True},
                                    dimensions=dimensions))
    figure.update_layout(height=420)
    return figure


def rungs(result: Result) -> Any:
    """Epochs each trial reached against its last objective: the rungs of Hyperband and ASHA."""
    import plotly.graph_objects as go
    figure = go.Figure()
    for status in STATUS_COLORS:
        trials = [t for t in result.trials if t.status == status and result.metric in t.metrics]
        if trials:
            figure.add_trace(go.Scatter(x=[t.epochs for t in trials], y=[t.metrics[result.metric] for t in trials],
                                        mode="markers", name=status, text=[t.trial_id for t in trials],
                                        marker={"color": STATUS_COLORS[status], "size": 9}))
    if not figure.data:
        return None
    figure.update_layout(height=380, xaxis_title="epochs trained", yaxis_title=result.metric)
    return figure


def lineage(result: Result) -> Any:
    """PBT: every trial over epochs, and an arrow from the trial whose state it copied."""
    import plotly.graph_objects as go
    history = result.history()
    figure = go.Figure()
    for trial in result.trials:
        rows = history[history.trial_id == trial.trial_id]
        figure.add_trace(go.Scatter(x=rows.epoch, y=[trial.trial_id] * len(rows), mode="lines+markers",
                                    name=trial.trial_id, marker={"size": 6}))
    for exploit in result.lineage().itertuples():
        figure.add_annotation(x=exploit.epoch + 0.5, y=exploit.trial_id, ax=exploit.epoch, ay=exploit.source,
                              xref="x", yref="y", axref="x", ayref="y", showarrow=True, arrowhead=2,
                              hovertext=json.dumps(exploit.config))
    figure.update_layout(height=160 + 30 * len(result.trials), xaxis_title="epoch", showlegend=False)
    return figure


def _number(value: float) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}
td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left}code{font-size:12px}
tr.status-failed,tr.status-diverged,tr.status-timeout{color:#9b2226}section{margin-top:28px}"""
