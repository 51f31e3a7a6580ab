"""The report's and the dashboard's figures of a run of many trials, drawn from aggregates
rather than a trace per trial: a browser draws thousands of traces slowly, and a page with a
line per trial of a 10,000-trial run would weigh hundreds of megabytes.

Learning curves: the best :data:`BEST_CURVES` trials, each its own line, over a band of
every trial's values at each epoch (the 10 % and 90 % quantiles, and the median). The Gantt
chart: each worker's busy share in :data:`TIME_SLICES` equal slices of the run's time.

Example:
    >>> import pandas as pd
    >>> schedule = pd.DataFrame({"worker": [0, 0, 1], "start": [0.0, 2.0, 0.0], "end": [1.0, 4.0, 4.0]})
    >>> edges, shares = busy_shares(schedule, [0, 1], slices=4)
    >>> edges.tolist(), shares.tolist()
    ([0.0, 1.0, 2.0, 3.0, 4.0], [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

DRAWN = 50           # trials a figure draws one by one; a run of more is aggregated
BEST_CURVES = 20     # the best trials whose learning curves a run of more than DRAWN shows
BAND = (0.1, 0.5, 0.9)
TIME_SLICES = 200
GANTT_BARS = 2000    # sub-epochs the Gantt chart draws one by one; more are binned


def add_band(figure: Any, history: pd.DataFrame, panel: str, column: int, first: bool) -> None:
    """Add to the ``column``-th panel of ``figure`` the band from the 10 % to the 90 %
    quantile of ``panel`` at each epoch, over every trial with a value there, and its median
    (``first``: the panel whose traces the legend names)."""
    import plotly.graph_objects as go
    values = history[["epoch", panel]].dropna()
    if values.empty:
        return
    by_epoch = values.groupby("epoch")[panel]
    quantiles = by_epoch.quantile(list(BAND)).unstack()
    epochs, counts = quantiles.index.to_numpy(), by_epoch.size().to_numpy()
    low, median, high = (quantiles[q].to_numpy() for q in BAND)
    grey = "rgba(120,120,120,0.25)"
    figure.add_trace(go.Scatter(x=epochs, y=low, mode="lines", line={"width": 0}, showlegend=False,
                                legendgroup="band", hoverinfo="skip"), row=1, col=column)
    figure.add_trace(go.Scatter(x=epochs, y=high, mode="lines", line={"width": 0}, fill="tonexty", fillcolor=grey,
                                name="every trial: 10-90 %", legendgroup="band", showlegend=first,
                                customdata=counts, hovertemplate="epoch %{x}: 90 % of %{customdata} trials "
                                                                 "below %{y:.4g}<extra></extra>"),
                     row=1, col=column)
    figure.add_trace(go.Scatter(x=epochs, y=median, mode="lines", line={"color": "#555", "dash": "dash"},
                                name="every trial: median", legendgroup="median", showlegend=first,
                                customdata=counts, hovertemplate="epoch %{x}: median of %{customdata} trials "
                                                                 "%{y:.4g}<extra></extra>"),
                     row=1, col=column)


def busy_shares(schedule: pd.DataFrame, workers: list[Any], slices: int = TIME_SLICES) -> tuple[np.ndarray, np.ndarray]:
    """The edges of ``slices`` equal slices of the span from the first sub-epoch's start to
    the last one's end, and each worker's busy share of each slice (workers x slices): the
    seconds its sub-epochs ran in the slice over the slice's length, each sub-epoch cut at the
    slice's edges. O(sub-epochs x log) per worker."""
    timed = schedule.dropna(subset=["start", "end"])
    edges = np.linspace(float(timed.start.min()), float(timed.end.max()), slices + 1)
    width = edges[1] - edges[0]
    shares = np.zeros((len(workers), slices))
    if width <= 0:           # no sub-epoch took any time
        return edges, shares
    for row, worker in enumerate(workers):
        mine = timed[timed.worker == worker]
        starts, ends = np.sort(mine.start.to_numpy(float)), np.sort(mine.end.to_numpy(float))
        # Busy seconds up to t: the sub-epochs ended by t whole, those under way since their start.
        started = np.searchsorted(starts, edges, side="right")
        ended = np.searchsorted(ends, edges, side="right")
        before = np.concatenate([[0.0], np.cumsum(ends)])[ended] + edges * (started - ended) \
            - np.concatenate([[0.0], np.cumsum(starts)])[started]
        shares[row] = np.diff(before) / width
    return edges, shares


def binned_gantt(schedule: pd.DataFrame, title: str) -> Any:
    """The Gantt chart of a long schedule: a heat map of each worker's busy share in
    :data:`TIME_SLICES` slices of the run's time."""
    import plotly.graph_objects as go
    workers = sorted(int(w) for w in schedule.worker.dropna().unique())
    edges, shares = busy_shares(schedule, workers)
    figure = go.Figure(go.Heatmap(
        z=shares, x=(edges[:-1] + edges[1:]) / 2, y=[f"worker {w}" for w in workers], zmin=0, zmax=1,
        colorscale="Blues", colorbar={"title": {"text": "busy"}, "tickformat": ".0%"},
        hovertemplate="%{y}, %{x:.1f} s: busy %{z:.0%}<extra></extra>"))
    figure.update_layout(height=160 + 40 * len(workers), xaxis_title="seconds since the run started",
                         title=f"{title}; each worker's busy share in {TIME_SLICES} slices of the run's time")
    return figure
