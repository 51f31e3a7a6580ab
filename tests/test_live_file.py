"""``live.json`` (:mod:`cerebro.observe._live`): rewritten while the driver lives, news or not,
so a reader tells a live run from a dead one by its age; the newest state always reaches the
file; and what a reader accepts from it is only what a driver writes."""
from __future__ import annotations

import json
import time

import pytest

from cerebro.observe._live import LiveFile
from cerebro.results._live import read_live, well_formed
from cerebro.store import RunStore, SubEpochStarted, TaskKind


def wait_for(condition, what: str, timeout: float = 30) -> None:
    """Poll ``condition`` (the file the writer thread writes) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.01)


@pytest.fixture
def live(tmp_path):
    observer = LiveFile(RunStore.create(str(tmp_path / "run")))
    observer.interval = 0.05
    observer.start(str(tmp_path / "run"), 2)
    yield observer
    observer.finish("finished")


def test_a_driver_with_no_news_keeps_live_json_fresh_and_its_newest_state_is_written(live, tmp_path):
    run_dir = str(tmp_path / "run")
    wait_for(lambda: read_live(run_dir) is not None, "the first write")
    first = read_live(run_dir)
    assert first["alive"] == [0, 1] and first["running"] == {} and first["outcome"] is None
    wait_for(lambda: read_live(run_dir)["updated"] > first["updated"], "a rewrite without any event")
    live.notify(SubEpochStarted("t0003", 2, 1, 1, TaskKind.EVAL))        # and then nothing more
    wait_for(lambda: read_live(run_dir)["running"] != {}, "the last event's state")
    doing = read_live(run_dir)["running"]["1"]
    assert (doing["trial_id"], doing["kind"], doing["epoch"], doing["partition"]) == ("t0003", "eval", 2, 1)
    live.finish("interrupted")
    ended = read_live(run_dir)
    assert (ended["outcome"], ended["alive"], ended["running"]) == ("interrupted", [], {})


@pytest.mark.parametrize("text", [
    '{"updated": Infinity, "alive": [], "running": {}, "traffic": {}}',
    '{"updated": NaN, "alive": [], "running": {}, "traffic": {}}',
    '[1, 2]',
    'not json',
])
def test_a_live_json_that_is_not_json_of_numbers_reads_as_none(tmp_path, text):
    (tmp_path / "live.json").write_text(text)
    assert read_live(str(tmp_path)) is None


GOOD = {"updated": 1.5, "outcome": None, "alive": [0, 1], "traffic": {"sent": 10, "received": 3, "between_workers": 0},
        "running": {"0": {"trial_id": "t0000", "kind": "train", "epoch": 1, "partition": 0, "since": 2.5,
                          "batches": 3, "total": None}}}


@pytest.mark.parametrize("damage", [
    {"updated": "soon"}, {"outcome": 3}, {"alive": "0,1"}, {"alive": [True]}, {"traffic": []},
    {"traffic": {"sent": "10"}}, {"running": []}, {"running": {"x": GOOD["running"]["0"]}},
    {"running": {"0": {**GOOD["running"]["0"], "trial_id": 7}}},
    {"running": {"0": {**GOOD["running"]["0"], "epoch": 1.5}}},
    {"running": {"0": {**GOOD["running"]["0"], "total": "8"}}},
    {"running": {"0": {k: v for k, v in GOOD["running"]["0"].items() if k != "partition"}}},
])
def test_only_what_a_driver_writes_is_well_formed(damage):
    assert well_formed(json.loads(json.dumps(GOOD)))
    assert not well_formed({**GOOD, **damage})
