"""Where a run with several objectives shows its Pareto front: ``cerebro status`` (a table of
the front's trials with each objective), the HTML report (that table and a scatter of the
first two objectives, the front highlighted) and the dashboard; and docs/guide.md § Several
objectives, run as written."""
from __future__ import annotations

import json
import re

import pytest
from _cli import cerebro
from _docs import run_section
from _two_objectives import BOTH, SPACE, curve, nothing

import cerebro as cb
from cerebro.report._dashboard import RunView
from cerebro.report._html import render


def test_the_guides_example_runs_as_written():
    """docs/guide.md § Several objectives: multi-objective TPE on a simulated curve, its front printed."""
    namespace, printed = run_section("docs/guide.md", "Several objectives", 1)
    front = namespace["result"].pareto()
    assert printed.splitlines() == [f"{t.trial_id} {t.config['width']} {round(t.best_metrics['val_accuracy'], 3)} "
                                    f"{t.best_metrics['params']}" for t in front]
    assert len({t.config["width"] for t in front}) == len(front) >= 3      # one width each: params rise with it


@pytest.fixture(scope="module")
def fronted(tmp_path_factory):
    store = tmp_path_factory.mktemp("fronted") / "run"
    result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=16, epochs=2, **BOTH), curve, seed=0, store=store)
    front = [t.trial_id for t in result.pareto()]
    assert 2 <= len(front) < len(result.trials)
    return result, front


def test_cerebro_status_shows_the_fronts_trials_with_each_objective(fronted, monkeypatch, capsys):
    result, front = fronted
    done = cerebro(monkeypatch, capsys, "status", result.run_dir)
    assert done.returncode == 0
    shown = done.stdout[done.stdout.index("Pareto front on val_accuracy (max), params (min)"):]
    rows = [line.split() for line in shown.splitlines() if re.match(r"^\s*t\d{4}\s", line)]
    assert [row[0] for row in rows] == front
    for row, trial in zip(rows, result.pareto()):
        best = trial.best_metrics
        assert row[3] == f"{best['val_accuracy']:.4f}" and row[4] == str(int(best["params"]))


def test_the_report_and_the_dashboard_show_the_front_table_and_its_scatter(fronted):
    result, front = fronted
    page = render(result)
    section = page[page.index('<section id="front">'):page.index('<section id="trials">')]
    assert re.findall(r"<tr class='front'><td>(t\d{4})</td>", section) == front
    assert "Objectives: val_accuracy (max), params (min)" in page
    scatter = page[page.index('<section id="pareto">'):]
    shown = json.dumps(front, separators=(",", ":"))
    assert 'id="figure-pareto"' in scatter and f'"text":{shown}' in scatter.replace(", ", ",")
    state = RunView(result.run_dir).state()
    assert re.findall(r"<tr class='front'><td>(t\d{4})</td>", state["sections"]["front"]) == front
    scatter = json.loads(state["figures"]["pareto"])["data"]
    assert [trace["name"] for trace in scatter] == ["other trials", "Pareto front"]
    assert scatter[1]["text"] == front


def test_a_single_objective_report_has_no_front(tmp_path):
    result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=2, epochs=1, metric="val_accuracy", mode="max"),
                         curve, store=tmp_path / "one")
    page = render(result)
    assert 'id="front"' not in page and "figure-pareto" not in page and "Objective: val_accuracy (max)." in page
    assert "front" not in RunView(result.run_dir).state()["sections"]
