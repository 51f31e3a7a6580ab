"""``cerebro dashboard RUN_DIR``: a live page about a run, running or finished, and its
Prometheus ``/metrics``, served read-only from the run directory (local or any fsspec URL).

The page is the report's (:mod:`._html`, :mod:`._figures`: the same code draws both) plus
what is under way: each worker's sub-epoch with the batches done of all it has (from
``live.json``, see :mod:`cerebro.observe._live`), failures, the run's settings. It polls
``/state`` once a second; the server re-reads the journal only when it has grown, and
redraws the charts only then. plotly.js is inlined: the page needs no network but the server's.

Routes: ``/`` (the page), ``/state`` (JSON: the sections' HTML and the charts' figures),
``/metrics`` (Prometheus text, :class:`._prometheus.RunCollector`). Nothing else is served,
and nothing is written: no request can change the run or read another file.
"""
from __future__ import annotations

import hashlib
import html
import json
import os
import time
from typing import Any

from ..results import Result, load
from ..results._live import LIVE_FILE, is_stale, read_live, well_formed
from ..store._bulk import collector_paused
from . import _figures
from ._html import _CSS, front_table, headline, trial_table
from ._prometheus import Reread

TABLE_ROWS = 100      # the trials listed: sent again at each change, to every page, each second
FIGURES = (("Learning curves", "curves"), ("Workers over time", "gantt"), ("Best so far", "best-so-far"),
           ("Configurations against the objective", "parallel"), ("Epochs each trial trained", "rungs"),
           ("The Pareto front on the first two objectives", "pareto"))


class RunView:
    """The run as the page shows it: what the journal says, rendered again only when the
    journal changed, and what ``live.json`` says, at each call."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = os.fspath(run_dir)
        self._journal = Reread(self.run_dir, self._render)
        self._journal.get()          # fails here, before serving, where it is no run

    def state(self, figures_seen: str = "") -> dict[str, Any]:
        """``version`` (changes with anything shown), ``sections`` (id -> HTML), and
        ``figures`` (id -> plotly JSON, or None where a chart has nothing to draw yet) with
        their ``figures_version``; ``figures`` is None where the caller has that version
        (``figures_seen``): the workers change each second, the charts only with the journal.
        Raises where the journal cannot be read (the server answers 503, saying why)."""
        done = self._journal.get()
        workers = _workers_now(self.run_dir)
        version = hashlib.sha256((done["digest"] + workers).encode()).hexdigest()[:16]
        return {"version": version, "sections": {**done["sections"], "workers": workers},
                "figures": None if figures_seen == done["digest"] else done["figures"],
                "figures_version": done["digest"]}

    def _render(self) -> dict[str, Any]:
        # The cyclic collector paused throughout: a 10,000-trial Result holds hundreds of
        # thousands of objects, and a pass over them holds the GIL the requests wait for. The
        # Result (in no cycle) is freed as _view returns, before the collector is on again.
        with collector_paused():
            return _view(load(self.run_dir))


def _view(result: Result) -> dict[str, Any]:
    sections, figures = _done_sections(result), _figures_of(result)
    digest = hashlib.sha256(json.dumps([sections, figures]).encode()).hexdigest()
    return {"sections": sections, "figures": figures, "digest": digest}


def _workers_now(run_dir: str) -> str:
    """The workers' section from ``live.json`` as it is now; what cannot be shown says why,
    in this section alone: a run directory is data that anyone may have written."""
    try:
        live = read_live(run_dir)
        if live is not None and not well_formed(live):
            return f"<p>{LIVE_FILE} is not one a driver wrote; nothing is shown from it.</p>"
        return _workers_section(live)
    except Exception as error:     # noqa: BLE001 (whatever the file holds or its read raises: this section says so)
        why = " ".join(f"{type(error).__name__}: {error}".split())[:500]
        return f"<p>{LIVE_FILE} cannot be shown: {html.escape(why)}</p>"


def _done_sections(result: Result) -> dict[str, str]:
    info = result.store.read_run_info()
    failed = [t for t in result.trials if str(t.status) in ("failed", "diverged", "timeout")]
    rows = "".join(f"<tr><td>{html.escape(t.trial_id)}</td><td>{html.escape(str(t.status))}</td>"
                   f"<td>{html.escape(t.reason or '')}</td></tr>" for t in failed)
    failures = (f"<table><tr><th>trial</th><th>status</th><th>why</th></tr>{rows}</table>" if failed
                else "<p>No trial has failed.</p>")
    shown = {k: info.get(k) for k in ("searcher", "backend", "workers", "seed", "limits", "time_budget",
                                       "visit_order", "reproducible")}
    front = front_table(result)      # several objectives only: one has no front
    return {"headline": headline(result), **({"front": front} if front else {}),
            "trials": trial_table(result, TABLE_ROWS), "failures": failures,
            "settings": f"<pre>{html.escape(json.dumps(shown, indent=1, default=str))}</pre>"}


def _figures_of(result: Result) -> dict[str, str | None]:
    made = {"curves": _figures.learning_curves(result), "best-so-far": _figures.best_so_far(result),
            "gantt": _figures.gantt(result), "rungs": _figures.rungs(result),
            "parallel": _figures.parallel_coordinates(result, _figures.log_keys(result)),
            "pareto": _figures.pareto_front(result)}
    return {name: None if figure is None else figure.to_json() for name, figure in made.items()}


def _workers_section(live: dict[str, Any] | None) -> str:
    """Each worker's sub-epoch under way, with its batches done of all, or why none shows."""
    if live is None:
        return "<p>No live state: the run has not started, or was written before live.json.</p>"
    if is_stale(live):
        ended = live.get("outcome") or "no driver is running it"
        return f"<p id='run-state'>The run is not running ({html.escape(str(ended))}).</p>"
    rows = []
    for worker, doing in sorted(live.get("running", {}).items(), key=lambda item: int(item[0])):
        total = doing.get("total")
        done = int(doing.get("batches", 0))
        bar = f"<progress value='{done}' max='{int(total)}'></progress> {done} of {int(total)} batches" if total \
            else f"{done} batches"
        since = time.time() - float(doing.get("since", time.time()))
        rows.append(f"<tr class='worker'><td>worker {html.escape(worker)}</td><td>{html.escape(doing['trial_id'])}"
                    f"</td><td>{html.escape(doing['kind'])} epoch {int(doing['epoch'])} partition "
                    f"{int(doing['partition'])}</td><td>{bar}</td><td>{since:.0f} s</td></tr>")
    idle = sorted({int(w) for w in live.get("alive", [])} - {int(w) for w in live.get("running", {})})
    note = f"<p>Idle: {', '.join(f'worker {w}' for w in idle)}</p>" if idle else ""
    return (f"<p id='run-state'>Running: {len(live.get('alive', []))} workers alive.</p>"
            f"<table><tr><th>worker</th><th>trial</th><th>sub-epoch</th><th>progress</th><th>for</th></tr>"
            f"{''.join(rows)}</table>{note}")


def page() -> bytes:
    """The page: empty sections the script fills from ``/state``, plotly.js inlined."""
    import plotly.offline
    top = "".join(f"<section><h2>{title}</h2><div id='{name}'></div></section>" for title, name in
                  (("Workers now", "workers"), ("Trials", "trials")))
    charts = "".join(f"<section id='chart-{name}'><h2>{html.escape(title)}</h2><div id='figure-{name}'></div>"
                     f"</section>" for title, name in FIGURES)
    bottom = "".join(f"<section><h2>{title}</h2><div id='{name}'></div></section>" for title, name in
                     (("Failures", "failures"), ("Settings", "settings")))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Cerebro dashboard</title>"
            f"<style>{_CSS} progress{{width:12em}} section:empty{{display:none}}</style>"
            f"<script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script></head><body>"
            f"<p id='connection'>Connecting...</p><div id='headline'></div><section id='front'></section>"
            f"{top}{charts}{bottom}"
            f"<script>{_SCRIPT}</script></body></html>").encode()


_SCRIPT = """
let version = "", figuresVersion = "";
async function poll() {
  const status = document.getElementById("connection");
  try {
    const answer = await fetch("state?since=" + version + "&figures=" + figuresVersion, {cache: "no-store"});
    if (answer.status === 200) {
      const state = await answer.json();
      version = state.version;
      for (const [id, markup] of Object.entries(state.sections)) document.getElementById(id).innerHTML = markup;
      figuresVersion = state.figures_version;
      for (const [name, figure] of Object.entries(state.figures || {})) {
        const chart = document.getElementById("chart-" + name);
        if (chart === null) continue;
        chart.style.display = figure === null ? "none" : "";
        if (figure !== null) {
          const parsed = JSON.parse(figure);
          Plotly.react("figure-" + name, parsed.data, parsed.layout, {displaylogo: false});
        }
      }
    }
    status.textContent = "Live: updated " + new Date().toLocaleTimeString();
  } catch (error) {
    status.textContent = "The dashboard's server cannot be reached (" + error + "); retrying.";
  }
  setTimeout(poll, 1000);
}
poll();
"""
