"""The report's charts (plotly figures) of a run, finished or still going: learning curves,
the objective's best so far against time and against trials, hyperparameter importance, the
Gantt chart of sub-epochs on workers, configurations against the objective, the rungs, and
PBT's lineage. Each returns None where the run has nothing to draw yet."""
from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd

from ..results import Result, TrialResult, flat_config
from ..results._importance import SAMPLED, importances
from ..results._trial_result import rounded
from ._aggregate import BEST_CURVES, DRAWN, GANTT_BARS, add_band, binned_gantt

STATUS_COLORS = {"completed": "#2a9d8f", "stopped": "#e9c46a", "failed": "#e76f51", "diverged": "#9b2226",
                 "timeout": "#6d597a", "running": "#457b9d"}


def log_keys(result: Result) -> set[str]:
    """The (dotted) keys of the trials' configs that the space draws log-uniformly. run.json
    records each top-level primitive as text; inside a nested one (a dict or a choice among
    dicts) a key is matched by its last name, as ``'lr': loguniform(`` in that text."""
    space = result.store.read_run_info()["searcher"].get("space", {})
    found = {key for key, shown in space.items() if str(shown).startswith("loguniform(")}
    for trial in result.trials:
        for key in flat_config(trial.config):
            top, _, rest = key.partition(".")
            if rest and f"'{rest.rsplit('.', 1)[-1]}': loguniform(" in str(space.get(top, "")):
                found.add(key)
    return found


def _best_trial(result: Result) -> str | None:
    try:
        return result.best.trial_id
    except RuntimeError:
        return None


def learning_curves(result: Result) -> Any:
    """Train and validation loss (log scale), the objective and, where a schedule changed it,
    the learning rate per epoch; the best trial highlighted; buttons show the trials of one
    status only. A run of more than :data:`DRAWN` trials: the best :data:`BEST_CURVES`
    trials over the band of every trial's values at each epoch (see :mod:`._aggregate`)."""
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
    many = len(result.trials) > DRAWN
    shown = result.ranked()[:BEST_CURVES] if many else result.trials
    if many:
        for column, panel in enumerate(panels, start=1):
            add_band(figure, history, panel, column, first=column == 1)
    statuses = _add_curves(figure, history, shown, panels, _best_trial(result))
    for column, panel in enumerate(panels, start=1):
        values = history[panel].dropna()
        if ("loss" in panel or panel == "train_lr") and len(values) and (values > 0).all():
            figure.update_yaxes(type="log", row=1, col=column)
    figure.update_layout(height=460, margin={"t": 110}, legend={"font": {"size": 9}})
    if many:
        figure.update_layout(title=f"the best {len(statuses) // len(panels)} of {len(result.trials):,} trials, "
                                   f"over every trial's 10-90 % band and median at each epoch")
    else:
        buttons = [{"label": "all", "method": "restyle", "args": [{"visible": [True] * len(statuses)}]}]
        for status in sorted(set(statuses)):
            buttons.append({"label": status, "method": "restyle",
                            "args": [{"visible": [s == status for s in statuses]}]})
        figure.update_layout(updatemenus=[{"buttons": buttons, "direction": "right", "x": 0, "y": 1.32,
                                           "xanchor": "left", "type": "buttons"}])
    figure.update_xaxes(title_text="epoch")
    return figure


def _add_curves(figure: Any, history: pd.DataFrame, trials: list[TrialResult], panels: list[str],
                best: str | None) -> list[str]:
    """A line per trial (of those with an epoch) in each panel, ``best`` highlighted; the
    status of each line added, in order."""
    import plotly.graph_objects as go
    ids = {t.trial_id for t in trials}
    rows_of = dict(tuple(history[history.trial_id.isin(ids)].groupby("trial_id", sort=False)))
    statuses: list[str] = []
    for trial in trials:
        rows = rows_of.get(trial.trial_id)
        if rows is None:
            continue
        highlight = trial.trial_id == best
        for column, panel in enumerate(panels, start=1):
            figure.add_trace(go.Scatter(
                x=rows.epoch, y=rows[panel], mode="lines+markers", name=f"{trial.trial_id} ({trial.status})",
                legendgroup=trial.trial_id, showlegend=column == 1,
                line={"width": 4 if highlight else 1.2,
                      "color": "#d62828" if highlight else STATUS_COLORS.get(trial.status, "#888")},
                opacity=1.0 if highlight else 0.6, hovertext=json.dumps(trial.config)), row=1, col=column)
            statuses.append(trial.status)
    return statuses


def best_so_far(result: Result) -> Any:
    """The objective's best value so far, over the run's time (each epoch counts when its last
    sub-epoch ended) and over the trials in the order they ended; each step line drawn through
    the points where the best changed (and the last), each named by the trial that set it."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    history, schedule = result.history(), result.schedule()
    if history.empty or schedule.empty or result.metric not in history:
        return None
    ended = schedule.groupby(["trial_id", "epoch"]).end.max().rename("time").reset_index()
    epochs = history.merge(ended, on=["trial_id", "epoch"]).dropna(subset=[result.metric]).sort_values("time")
    if epochs.empty:
        return None
    running = epochs[result.metric].cummin() if result.mode == "min" else epochs[result.metric].cummax()
    by_trial = epochs.groupby("trial_id").agg(time=("time", "max"), value=(result.metric,
                                                                          "min" if result.mode == "min" else "max"))
    by_trial = by_trial.sort_values("time")
    trial_best = by_trial.value.cummin() if result.mode == "min" else by_trial.value.cummax()
    steps, holders = _steps(running.to_numpy(), epochs.trial_id.to_numpy())
    figure = make_subplots(rows=1, cols=2, subplot_titles=["against time", "against trials, in the order they ended"])
    figure.add_trace(go.Scatter(x=epochs.time.to_numpy()[steps], y=running.to_numpy()[steps], mode="lines",
                                line_shape="hv", name="best so far", text=holders), row=1, col=1)
    figure.add_trace(go.Scatter(x=epochs.time, y=epochs[result.metric], mode="markers", name="each epoch",
                                marker={"size": 4, "color": "#aaa"}, text=epochs.trial_id), row=1, col=1)
    steps, holders = _steps(trial_best.to_numpy(), by_trial.index.to_numpy())
    figure.add_trace(go.Scatter(x=steps + 1, y=trial_best.to_numpy()[steps], mode="lines+markers",
                                line_shape="hv", name="best trial so far", text=holders), row=1, col=2)
    figure.update_xaxes(title_text="seconds since the run started", row=1, col=1)
    figure.update_xaxes(title_text="trials ended", row=1, col=2)
    figure.update_yaxes(title_text=f"{result.metric} ({result.mode})", row=1, col=1)
    if "loss" in result.metric and (epochs[result.metric] > 0).all():
        figure.update_yaxes(type="log")
    figure.update_layout(height=380)
    return figure


def _steps(best: np.ndarray, trial_ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Where a running best changes (the first point too) and the last point, and at each the
    trial that holds the best there: a step line through them is the whole line."""
    changed = np.flatnonzero(np.concatenate([[True], best[1:] != best[:-1]]))
    steps = changed if changed[-1] == len(best) - 1 else np.append(changed, len(best) - 1)
    holders = trial_ids[changed[np.searchsorted(changed, steps, side="right") - 1]]
    return steps, [str(t) for t in holders]


def pareto_front(result: Result) -> Any:
    """A run with several objectives: every trial at its best epoch by the first metric, the
    first two objectives against each other, the Pareto front (on all of them) highlighted and
    joined in the order of the first; None for one objective or before a trial has each."""
    import plotly.graph_objects as go
    if len(result.objectives) < 2:
        return None
    front = result.pareto()
    if not front:
        return None
    (x, x_mode), (y, y_mode) = result.objectives[:2]
    ids = {t.trial_id for t in front}
    others = [t for t in result.trials if t.trial_id not in ids and not t.status.is_failure
              and all(_finite(t.best_metrics.get(m)) for m in (x, y))]
    figure = go.Figure()
    for name, trials, style in (("other trials", others, {"color": "#aaa", "size": 7}),
                                ("Pareto front", front, {"color": "#d62828", "size": 11})):
        figure.add_trace(go.Scatter(x=[t.best_metrics[x] for t in trials], y=[t.best_metrics[y] for t in trials],
                                    mode="lines+markers" if trials is front else "markers", name=name,
                                    line={"shape": "hv", "color": style["color"]}, marker=style,
                                    text=[t.trial_id for t in trials],
                                    hovertext=[f"{t.trial_id}: {rounded(t.config)}" for t in trials]))
    figure.update_layout(height=420, xaxis_title=f"{x} ({x_mode})", yaxis_title=f"{y} ({y_mode})",
                         title=f"{len(front)} trials on the front of {len(result.objectives)} objectives, each at "
                               f"its best epoch by {x}")
    return figure


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def importance(result: Result, log: Collection[str]) -> Any:
    """fANOVA importance of each varying hyperparameter for the objective at the best epoch."""
    import plotly.graph_objects as go
    shares = importances(result, log)
    if not shares:
        return None
    keys = list(shares)[::-1]      # the largest on top
    figure = go.Figure(go.Bar(x=[shares[k] for k in keys], y=keys, orientation="h",
                              text=[f"{shares[k]:.0%}" for k in keys], textposition="auto"))
    over = f"a random {SAMPLED} of the trials'" if len(result.trials) > SAMPLED else "the trials'"
    figure.update_layout(height=120 + 40 * len(keys), xaxis_title=f"share of the variance of {result.metric} "
                                                                  f"(Optuna's fANOVA over {over} best epochs)")
    return figure


def utilization(schedule: pd.DataFrame, workers: int) -> float:
    """Busy time / (workers × the span from the first sub-epoch to the last)."""
    if schedule.empty:
        return math.nan
    span = schedule.end.max() - schedule.start.min()
    return float((schedule.end - schedule.start).sum() / (workers * span)) if span > 0 else math.nan


def gantt(result: Result) -> Any:
    """One bar per sub-epoch on its worker's row, coloured by trial; eval sub-epochs paler.
    More than :data:`GANTT_BARS` sub-epochs: each worker's busy share over time, binned."""
    import plotly.graph_objects as go
    schedule = result.schedule()
    if schedule.empty:
        return None
    workers = result.store.read_run_info()["workers"]
    title = f"utilization {utilization(schedule, workers):.3f} (busy / (workers × span)); {len(schedule)} sub-epochs"
    if len(schedule) > GANTT_BARS:
        return binned_gantt(schedule, title)
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
                         title=f"{title}, eval paler", showlegend=len(result.trials) <= 40)
    return figure


def parallel_coordinates(result: Result, log: Collection[str]) -> Any:
    """Every trial's configuration (keys the trials share a value of left out; log-uniform keys
    on a log scale) and last value of the objective."""
    import plotly.graph_objects as go
    scored = [t for t in result.trials if isinstance(t.metrics.get(result.metric), (int, float))
              and math.isfinite(t.metrics[result.metric])]
    if not scored:
        return None
    configs = [flat_config(t.config) for t in scored]
    dimensions = []
    for key in dict.fromkeys(k for config in configs for k in config):     # every branch's keys
        values = [config.get(key) for config in configs]
        if len({json.dumps(v) for v in values}) == 1:
            continue
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) == len(values):
            dimensions.append(_numeric_axis(key, numbers, key in log and min(numbers) > 0))
        else:
            labels = sorted({json.dumps(v) for v in values})
            place = {label: index for index, label in enumerate(labels)}
            dimensions.append({"label": key, "values": np.array([place[json.dumps(v)] for v in values]),
                               "tickvals": list(range(len(labels))), "ticktext": labels})
    objective = np.array([t.metrics[result.metric] for t in scored], dtype=float)    # sent as binary, not text
    dimensions.append({"label": result.metric, "values": objective})
    figure = go.Figure(go.Parcoords(line={"color": objective, "colorscale": "Viridis", "showscale": True},
                                    dimensions=dimensions))
    figure.update_layout(height=420)
    return figure


def _numeric_axis(key: str, values: list[float], log: bool) -> dict[str, Any]:
    """A parallel-coordinates axis; a log one holds log10 of the values, ticked at decades in
    the values themselves (plotly's parcoords has no log axis)."""
    if not log:
        return {"label": key, "values": np.array(values, dtype=float)}
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    ticks = list(range(low, high + 1))
    return {"label": f"{key} (log)", "values": np.log10(np.array(values, dtype=float)), "range": [low, high],
            "tickvals": ticks, "ticktext": [f"{10.0 ** t:g}" for t in ticks]}


def rungs(result: Result) -> Any:
    """Epochs each trial reached against its last objective: the rungs of Hyperband and ASHA
    (None where every trial trained as long)."""
    import plotly.graph_objects as go
    if len({t.epochs for t in result.trials}) < 2:
        return None
    figure = go.Figure()
    for status in STATUS_COLORS:
        trials = [t for t in result.trials if t.status == status and result.metric in t.metrics]
        if trials:
            figure.add_trace(go.Scatter(x=np.array([t.epochs for t in trials]),
                                        y=np.array([t.metrics[result.metric] for t in trials], dtype=float),
                                        mode="markers", name=status, text=[t.trial_id for t in trials],
                                        marker={"color": STATUS_COLORS[status], "size": 9}))
    if not figure.data:
        return None
    figure.update_layout(height=380, xaxis_title="epochs trained", yaxis_title=result.metric)
    return figure


def lineage(result: Result) -> Any:
    """PBT: every trial over epochs, and an arrow from the trial whose state it copied, labelled
    with the source and the hyperparameters the copy went on with."""
    import plotly.graph_objects as go

    history = result.history()
    figure = go.Figure()
    for trial in result.trials:
        rows = history[history.trial_id == trial.trial_id]
        figure.add_trace(go.Scatter(x=rows.epoch, y=[trial.trial_id] * len(rows), mode="lines+markers",
                                    name=trial.trial_id, marker={"size": 6}))
    for exploit in result.lineage().itertuples():
        changed = {k: v for k, v in flat_config(exploit.config).items()
                   if flat_config(exploit.previous_config).get(k) != v}
        figure.add_annotation(x=exploit.epoch + 0.5, y=exploit.trial_id, ax=exploit.epoch, ay=exploit.source,
                              xref="x", yref="y", axref="x", ayref="y", showarrow=True, arrowhead=2, text="")
        # the label at the head: one exploit per trial and epoch, so labels never overlap
        figure.add_annotation(x=exploit.epoch + 0.5, y=exploit.trial_id, showarrow=False, xanchor="left",
                              yanchor="bottom", text=f"from {exploit.source}: {rounded(changed)}",
                              font={"size": 10}, hovertext=json.dumps(exploit.config))
    figure.update_layout(height=160 + 40 * len(result.trials), xaxis_title="epoch", yaxis_title="trial",
                         showlegend=False)
    return figure
