"""Every view of a 1,000-trial run says what its journal says (issue 60): the counts of each
status, the best trial, ``cerebro status``'s front page, the HTML report and the dashboard,
with figures that aggregate (the best 20 curves over a band, a binned Gantt chart) instead of
a trace per trial. The run is ``cb.simulate``'s ASHA, some of whose trials fail: stops,
promotions and failures in a real run directory in a second. Nothing here is timed
(benchmarks/views_at_scale.py times them)."""
from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import weakref
from collections import Counter

import pytest
from _browser import CHROMIUM_FLAGS, chromium_path
from _cli import cerebro
from _docs import run_section

import cerebro as cb
from cerebro.report import _aggregate, _figures
from cerebro.report._dashboard import RunView

TRIALS = 1000
SPACE = {"lr": cb.loguniform(1e-4, 1e-1), "width": cb.choice([32, 64, 128, 256]), "dropout": cb.uniform(0, 0.5)}


def no_model(config):
    """Never called by cb.simulate."""


def objective(config, epoch):
    if config["width"] == 32 and config["dropout"] > 0.45:
        raise ValueError("a trial's own failure")
    loss = abs(math.log10(config["lr"] / 3e-3)) + config["dropout"] / 4 + 8 / (epoch * math.sqrt(config["width"]))
    return {"train_loss": loss, "val_loss": 1.1 * loss}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> cb.Result:
    store = tmp_path_factory.mktemp("views") / "run"
    return cb.simulate(cb.ASHA(no_model, SPACE, num_trials=TRIALS, max_epochs=9), objective, workers=2, seed=0,
                       store=store)


@pytest.fixture(scope="module")
def journal(run) -> list[dict]:
    """The journal's events read with json alone: what the views are checked against."""
    with open(os.path.join(run.run_dir, "journal.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def report(run, tmp_path_factory) -> str:
    path = cb.report.write_report(run.run_dir, tmp_path_factory.mktemp("report") / "report.html")
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_the_counts_of_each_status_are_the_journals(run, journal):
    ended = Counter(e["status"] for e in journal if e["event"] == "trial_ended")
    assert sum(ended.values()) == TRIALS == len({e["trial_id"] for e in journal if e["event"] == "trial_created"})
    assert set(ended) == {"completed", "stopped", "failed"}       # rungs stopped some; the objective failed some
    assert Counter(str(t.status) for t in cb.load(run.run_dir).trials) == ended


def test_the_best_trial_is_the_one_with_the_best_epoch_in_the_journal(run, journal):
    failed = {e["trial_id"] for e in journal if e["event"] == "trial_ended" and e["status"] == "failed"}
    epochs = [(e["metrics"]["val_loss"], e["trial_id"], e["epoch"]) for e in journal
              if e["event"] == "epoch_end" and e["trial_id"] not in failed]
    value, trial_id, epoch = min(epochs)
    best = cb.load(run.run_dir).best
    assert (best.trial_id, best.best_epoch, best.best_metrics["val_loss"]) == (trial_id, epoch, value)
    history = run.history()
    assert len(history) == len(epochs) + sum(e["event"] == "epoch_end" and e["trial_id"] in failed for e in journal)


def test_status_shows_the_best_20_and_the_counts_on_one_screen(run, journal, monkeypatch, capsys):
    shown = cerebro(monkeypatch, capsys, "status", run.run_dir)
    assert shown.returncode == 0
    rows = [line.split()[0] for line in shown.stdout.splitlines() if line.strip().startswith("t0")]
    assert rows == [t.trial_id for t in run.ranked()[:20]] and rows[0] == run.best.trial_id
    ended = Counter(e["status"] for e in journal if e["event"] == "trial_ended")
    counts = ", ".join(f"{n:,} {s}" for s, n in ended.most_common())
    assert f"the best 20 of 1,000 trials ({counts}); --all shows every one" in shown.stdout
    assert shown.stdout.startswith("finished: 1000 of 1000 trials ended")
    assert len(shown.stdout.splitlines()) < 40


def test_the_learning_curves_are_the_best_20_over_a_band_of_every_trial(run):
    curves = _figures.learning_curves(run)
    panels = ["train_loss", "val_loss"]
    bands = [t for t in curves.data if t.legendgroup in ("band", "median")]
    trials = [t for t in curves.data if t not in bands]
    assert len(bands) == 3 * len(panels) and len(trials) == 20 * len(panels) < TRIALS
    assert list(dict.fromkeys(t.legendgroup for t in trials)) == [t.trial_id for t in run.ranked()[:20]]
    history = run.history()
    median = next(t for t in bands if t.legendgroup == "median" and t.xaxis == "x")     # train_loss's panel
    assert list(median.y) == list(history.groupby("epoch").train_loss.median())
    assert "the best 20 of 1,000 trials" in curves.layout.title.text


def test_the_gantt_chart_bins_each_workers_busy_time(run):
    schedule = run.schedule()
    assert len(schedule) > _aggregate.GANTT_BARS
    [heat] = _figures.gantt(run).data
    edges, shares = _aggregate.busy_shares(schedule, [0, 1])
    assert heat.type == "heatmap" and list(heat.y) == ["worker 0", "worker 1"]
    assert shares.shape == (2, _aggregate.TIME_SLICES) and shares.min() >= 0 and shares.max() <= 1 + 1e-9
    for worker in (0, 1):       # the busy seconds of the slices add up to the worker's sub-epochs'
        mine = schedule[schedule.worker == worker]
        assert shares[worker].sum() * (edges[1] - edges[0]) == pytest.approx((mine.end - mine.start).sum())


def test_the_report_names_the_best_trial_and_draws_aggregates(run, report):
    best = run.best
    assert f"Best: <b>{best.trial_id}</b> at epoch {best.best_epoch}" in report
    assert report.count("<tr class='status-") == TRIALS             # the table: every trial, up to 1,000
    assert len(report.encode()) < 10_000_000
    curves = report[report.index('id="figure-curves"'):report.index('id="figure-best-so-far"')]
    assert curves.count('"legendgroup":"t') == 2 * 20                 # 20 trials in two panels, not 1,000
    gantt = report[report.index('id="figure-gantt"'):report.index('id="figure-parallel"')]
    assert "each worker's busy share in 200 slices" in gantt and '"name":"t' not in gantt     # no bar per trial


def test_the_dashboard_lists_the_best_100_and_leads_as_the_report(run, report):
    state = RunView(run.run_dir).state()
    trials = state["sections"]["trials"]
    assert trials.count("<tr class='status-") == 100 and "The best 100 of 1,000 trials" in trials
    assert state["sections"]["headline"] in report
    assert json.loads(state["figures"]["gantt"])["data"][0]["type"] == "heatmap"


def test_a_result_is_freed_with_no_pass_of_the_cyclic_collector(run):
    """A Result and its trials form no reference cycle: the dashboard, reading a growing run
    again and again, frees each with no collector pass over all it held (the GIL held)."""
    gc.disable()
    try:
        result = cb.load(run.run_dir)
        best, gone = result.best, weakref.ref(result)
        del result
        assert gone() is None                                     # freed by reference counting alone
        assert (best._require_result().store.path, best._require_result().metric) == (run.run_dir, run.metric)
    finally:
        gc.enable()


@pytest.mark.slow
def test_the_report_renders_in_headless_chromium(report, tmp_path):
    chromium = chromium_path()
    page = tmp_path / "report.html"
    page.write_text(report, encoding="utf-8")
    loaded = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                             "--enable-logging=stderr", "--v=0", "--dump-dom", f"file://{page}"],
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    console = [line for line in loaded.stderr.splitlines() if ":CONSOLE" in line and "WebGL" not in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
    dom = loaded.stdout
    curves = dom[dom.index('id="figure-curves"'):dom.index('id="figure-best-so-far"')]
    assert curves.count('class="trace scatter ') == 2 * (20 + 3)     # the best 20, the band's 3, in two panels
    gantt = dom[dom.index('id="figure-gantt"'):dom.index('id="figure-parallel"')]
    assert "heatmaplayer" in gantt and 'class="point"' not in gantt


def test_the_guides_section_on_thousands_of_trials_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace, printed = run_section("docs/guide.md", "Runs of thousands of trials", 1)
    result = namespace["result"]
    journaled = Counter(e["status"] for e in result.store.events() if e["event"] == "trial_ended")
    assert namespace["counts"] == dict(journaled) and sum(journaled.values()) == len(result.trials) == 2000
    best = min(result.trials, key=lambda t: (t.best_metrics["val_loss"], t.trial_id))
    assert printed.startswith(f"2000 trials: {namespace['counts']}; best {best.trial_id} ")
