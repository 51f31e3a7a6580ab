"""What a scrape of ``/metrics`` costs the run it serves (issue 58, point 6): scrapers slowed a
live run, since each request loaded the whole run and redid pandas work over the whole
schedule in the driver, under its GIL.

Now the journal is followed (each line folded once) and the answer made again only when the
run changed, at most once in ``REFRESH`` seconds while it goes on; and the server takes at
most its share of a core whatever its clients do. What a scrape says is what it said: each
metric equals the one the old code computed from the whole run, at every line of a journal.
"""
from __future__ import annotations

import math
import os
import select
import shutil
import socket
import time
import urllib.request
import warnings

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import cerebro as cb
from cerebro.report import _prometheus, _tally
from cerebro.report._http import RunServer
from cerebro.report._prometheus import RunCollector
from cerebro.results import NoBestTrialError
from cerebro.store import RunResumed, RunStore, StateLost, SubEpoch, TaskKind, TrialEnded, TrialStatus

TESTS = os.path.dirname(os.path.abspath(__file__))
_Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def run_dir(tmp_path) -> str:
    """A run to scrape, made without workers: the committed run of an older version (7 trials
    completed, stopped or parked, 75 sub-epochs on 2 workers, 32 hops)."""
    return str(shutil.copytree(os.path.join(TESTS, "fixtures", "legacy_run"), tmp_path / "run",
                               ignore=shutil.ignore_patterns("live.json")))


def old_metrics(run_dir: str) -> _Samples:
    """What the code before issue 58 answered of the journal's metrics (those of live.json
    aside): the whole run loaded, pandas over its whole schedule."""
    with warnings.catch_warnings():           # the damaged line, said each time
        warnings.simplefilter("ignore")
        result = cb.load(run_dir)
    schedule, run = result.schedule(), os.path.basename(run_dir)
    samples: _Samples = {}

    def put(name: str, value: float, **labels: str) -> None:
        samples[name, tuple(sorted({"run": run, **labels}.items()))] = float(value)
    for (worker, kind), rows in schedule.groupby(["worker", "kind"], sort=True):
        put("cerebro_sub_epochs_total", len(rows), worker=str(worker), kind=str(kind))
    put("cerebro_epochs_total", sum(t.epochs for t in result.trials))
    counts = pd.Series([str(t.status) for t in result.trials], dtype=object).value_counts()
    for status in TrialStatus:
        put("cerebro_trials", int(counts.get(str(status), 0)), status=str(status))
    try:
        put("cerebro_best_metric", result.best.best_metrics[result.metric], metric=result.metric, mode=result.mode)
    except NoBestTrialError:
        pass
    for worker, rows in schedule.groupby("worker", sort=True):
        put("cerebro_worker_busy_seconds_total", (rows.end - rows.start).sum(), worker=str(worker))
    span = schedule.end.max() - schedule.start.min() if not schedule.empty else math.nan
    workers = int(result.store.read_run_info()["workers"])
    put("cerebro_utilization", (schedule.end - schedule.start).sum() / (workers * span) if span > 0 else 0.0)
    train = schedule[schedule.kind == "train"].sort_values(["trial_id", "start"], kind="stable")
    before = train.groupby("trial_id").worker.shift()
    hops = train[before.notna() & (before != train.worker)]
    put("cerebro_hops_total", len(hops))
    for kind, rows in schedule.groupby("kind", sort=True):
        histogram(put, "cerebro_sub_epoch_seconds", (rows.end - rows.start).to_numpy(), _tally.SUB_EPOCH_BUCKETS,
                  kind=str(kind))
    outside = (hops.end - hops.start - hops.compute.fillna(0)).clip(lower=0).to_numpy()
    histogram(put, "cerebro_hop_seconds", outside, _tally.HOP_BUCKETS)
    return samples


def histogram(put, name: str, values, bounds: tuple[float, ...], **labels: str) -> None:
    for bound in bounds:
        put(f"{name}_bucket", (values <= bound).sum(), le=str(bound), **labels)
    put(f"{name}_bucket", len(values), le="+Inf", **labels)
    put(f"{name}_count", len(values), **labels)
    put(f"{name}_sum", values.sum(), **labels)


def parsed(text: str) -> _Samples:
    """The samples of a /metrics text, but live.json's and the histograms' creation times."""
    shown = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in text_string_to_metric_families(text) for s in family.samples}
    live = ("cerebro_workers_live", "cerebro_bytes_moved_total", "cerebro_sub_epoch_batches",
            "cerebro_sub_epoch_planned_batches")
    return {key: value for key, value in shown.items() if key[0] not in live and not key[0].endswith("_created")}


def said(collector: RunCollector) -> _Samples:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return parsed(generate_latest(registry).decode())


def assert_same(new: _Samples, old: _Samples, where: str) -> None:
    """Equal, but sums of seconds: added in the schedule's order, not pandas' pairwise order."""
    assert new.keys() == old.keys(), (where, set(new) ^ set(old))
    for key, value in old.items():
        sums = key[0] in ("cerebro_worker_busy_seconds_total", "cerebro_utilization") or key[0].endswith("_sum")
        assert new[key] == value or (sums and math.isclose(new[key], value, rel_tol=1e-12)), (where, key, new[key],
                                                                                                value)


def with_events(run_dir: str) -> list[bytes]:
    """The lines of the run's journal followed by events that take sub-epochs back or come out
    of order (a lost state, a resume, a re-run, a trial never created, a damaged line) and the
    failure of the best trial; the journal is left empty."""
    store, result = RunStore.open(run_dir), cb.load(run_dir)
    end, best = max(e.get("time") or 0 for e in store.events()), result.best.trial_id     # failed, it leads no more
    # Between two train sub-epochs of a trial, one on a third worker: a hop more.
    trains = result.schedule().query("kind == 'train'").sort_values(["trial_id", "start"])
    a, b = next((a, b) for (_, a), (_, b) in zip(trains.iterrows(), trains.iloc[1:].iterrows())
                if a.trial_id == b.trial_id)

    def sub_epoch(trial: str, epoch: int, partition: int, worker: int, start: float) -> SubEpoch:
        return SubEpoch(trial, epoch, partition, worker, TaskKind.TRAIN, start, start + 0.5, 0.25)
    for event in (StateLost("t0000", 3, [0], "its worker was lost", end + 1), sub_epoch("t0000", 3, 0, 1, end + 2),
                  RunResumed({0: {"pid": 1}, 1: {"pid": 2}}, end + 3, 0.0), sub_epoch("t0001", 2, 0, 0, end + 4),
                  sub_epoch("t0099", 4, 0, 0, end + 5), sub_epoch("t0002", 4, 1, 1, end + 6),
                  sub_epoch(a.trial_id, 9, 0, int(trains.worker.max()) + 1, (a.start + b.start) / 2),
                  TrialEnded(best, TrialStatus.FAILED, "boom", end + 7)):
        store.emit(event)
    path = os.path.join(run_dir, "journal.jsonl")
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    lines.insert(len(lines) - 2, lines[-3].replace(b'"crc": "', b'"crc": "0'))     # a damaged line, skipped
    open(path, "wb").close()
    return lines


def test_each_metric_is_what_the_whole_run_read_at_once_says_at_every_line_of_its_journal(run_dir, monkeypatch):
    lines = with_events(run_dir)
    journal, following = os.path.join(run_dir, "journal.jsonl"), RunCollector(run_dir)
    folded = []
    real_apply = _tally.RunTally.apply
    monkeypatch.setattr(_tally.RunTally, "apply", lambda self, record: folded.append(1) or real_apply(self, record))
    for count in range(len(lines) + 1):
        with open(journal, "ab") as f:        # the run goes on: a line more (and half of the next)
            f.write(lines[count - 1][len(lines[count - 1]) // 2:] if count else b"")
            f.write(lines[count][:len(lines[count]) // 2] if count < len(lines) else b"")
        assert_same(said(following), old_metrics(run_dir), f"after line {count}")
    assert len(folded) == len(lines) - 1     # each good line folded once, however many scrapes
    final = said(following)
    assert final[("cerebro_hops_total", (("run", "run"),))] > 0
    assert final[("cerebro_trials", (("run", "run"), ("status", "failed")))] == 1


def metrics_of(url: str) -> _Samples:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return parsed(answer.read().decode())


def test_scrapes_of_a_run_standing_still_make_the_answer_once_and_what_comes_next_shows(run_dir, monkeypatch):
    journal = os.path.join(run_dir, "journal.jsonl")
    lines = open(journal, "rb").read().splitlines(keepends=True)
    first_end = next(i for i, line in enumerate(lines) if b'"event": "epoch_end"' in line)
    with open(journal, "wb") as f:
        f.write(b"".join(lines[:first_end + 1]))
    made = []
    real_collect = RunCollector.collect
    monkeypatch.setattr(RunCollector, "collect", lambda self: made.append(1) or real_collect(self))
    server = RunServer(run_dir, port=0, dashboard=False)
    server.serve_in_thread()
    url, epochs = server.url + "metrics", ("cerebro_epochs_total", (("run", "run"),))
    try:
        answers = [metrics_of(url) for _ in range(50)]
        assert len(made) == 1 and all(answer == answers[0] for answer in answers)
        assert answers[0][epochs] == 1
        with open(journal, "ab") as f:          # the run goes on, epoch after epoch, to its end
            f.write(b"".join(lines[first_end + 1:]))
        time.sleep(_prometheus.REFRESH)
        whole = old_metrics(run_dir)
        assert metrics_of(url)[epochs] == whole[epochs] > 1 and len(made) == 2
        assert_same(metrics_of(url), whole, "the whole run")
        # While the run goes on, the answer is made at most once in REFRESH seconds ...
        server.metrics.refresh = 3600.0
        with open(journal, "ab") as f:
            f.write(lines[-1])
        assert [metrics_of(url)[epochs] for _ in range(20)] == [whole[epochs]] * 20 and len(made) == 2
        # ... but a journal replaced or cut is read at once.
        with open(journal, "wb") as f:
            f.write(b"".join(lines[:first_end + 1]))
        assert metrics_of(url)[epochs] == 1 and len(made) == 3
    finally:
        server.shutdown()
        server.server_close()


def test_past_its_cpu_budget_the_server_takes_no_connection_until_the_time_is_made_up(run_dir):
    server = RunServer(run_dir, port=0, dashboard=False, cpu_share=0.02)
    server.serve_in_thread()
    ask = b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
    try:
        for _ in range(5):
            metrics_of(server.url + "metrics")
        assert server.budget.spent > 0          # what answering took is counted
        server.budget.charge(10.0)              # as if clients had taken 10 CPU seconds: 500 s to make up
        with socket.create_connection(("127.0.0.1", server.bound[1]), timeout=30) as waiting:
            waiting.sendall(ask)
            assert select.select([waiting], [], [], 2.0)[0] == []      # queued by the kernel, not taken
            server.budget.charge(-10.0)
            waiting.settimeout(30)
            answer = b"".join(iter(lambda: waiting.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.0 200") and b"cerebro_epochs_total" in answer
        server.budget.charge(10.0)
        left_waiting = socket.create_connection(("127.0.0.1", server.bound[1]), timeout=30)
        time.sleep(0.5)
    finally:
        started = time.monotonic()
        server.shutdown()                       # not held up by a connection waiting for the budget
        server.server_close()
    assert time.monotonic() - started < 5
    left_waiting.close()
