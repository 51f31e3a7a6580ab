"""``cerebro dashboard`` and Prometheus ``/metrics`` (issue 37): a live run rendered in
headless Chromium, whose DOM lists the trials, shows each worker's batches done of its
sub-epoch, and changes as epochs finish; ``/metrics`` parsed by prometheus-client's own
parser, from the driver (``fit(metrics_port=...)``) while the run goes and from the run
directory after, agreeing with the run's schedule and history; and a server that serves
three routes and nothing else."""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from _browser import CHROMIUM_FLAGS, chromium_path
from _faults import epochs_journaled, hold_at
from _models import build, digits
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import cerebro as cb
from cerebro.cli import main
from cerebro.observe._metrics import MetricsEndpoint
from cerebro.report._http import RunServer
from cerebro.results._live import read_live

pytestmark = pytest.mark.slow
TESTS = os.path.dirname(__file__)
TRIAL_ROW = re.compile(r'<tr class="status-[a-z]+"><td>(t\d+)</td><td>([a-z]+)</td><td>(\d+)</td>')
SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import os
from _faults import held
from _models import build, digits
import cerebro as cb


def held_build(config):
    trainable = build(config)
    trainable.loss = held(trainable.loss, {hold!r}, os.path.abspath("run"))
    return trainable


if __name__ == "__main__":
    space = {{"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32]), "slow": {slow}}}
    cb.GridSearch(held_build, space, epochs=3).fit(digits(partitions=2), workers=2, store="run", seed=0, verbose=0,
                                                  metrics_port={port})
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 240) -> None:
    """Poll ``condition`` (files a run writes) until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.1)


@contextlib.contextmanager
def slow_run(tmp_path, metrics_port: int, slow: float = 0.25) -> Iterator[subprocess.Popen]:
    """A grid of 4 trials x 3 epochs on 2 workers whose batches take ``slow`` seconds each,
    held where ``tmp_path / "hold"`` says (see ``_faults.held``)."""
    (tmp_path / "experiment.py").write_text(SCRIPT.format(tests=TESTS, slow=slow, port=metrics_port,
                                                          hold=str(tmp_path / "hold")))
    process = subprocess.Popen([sys.executable, "experiment.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)


def working(run_dir: str) -> bool:
    """Whether the run's ``live.json`` shows a worker in a sub-epoch."""
    return bool((read_live(run_dir) or {}).get("running"))


def metrics(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def rendered(chromium: str, url: str, profile) -> str:
    loaded = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                            capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    return loaded.stdout


def test_a_live_run_in_headless_chromium_lists_its_trials_and_changes_as_epochs_finish(tmp_path):
    chromium = chromium_path()
    run_dir, port, hold = str(tmp_path / "run"), free_port(), str(tmp_path / "hold")
    hold_at(hold, 1)        # each look at the live run is taken while it is held, not raced
    with slow_run(tmp_path, port) as process:
        wait_for(lambda: epochs_journaled(run_dir) >= 1 and working(run_dir), "the first epoch's end")
        server = RunServer(run_dir, port=0)
        server.serve_in_thread()
        first = rendered(chromium, server.url, tmp_path / "profile1")
        trials = {trial: int(epochs) for trial, _, epochs in TRIAL_ROW.findall(first)}
        assert sorted(trials) == ["t0000", "t0001", "t0002", "t0003"]
        assert re.search(r'<td>worker [01]</td><td>t000\d</td><td>(train|eval) epoch \d partition [01]</td>'
                         r'<td><progress value="\d+" max="\d+"></progress> \d+ of \d+ batches</td>', first), first
        assert re.search(r'id="connection">Live: updated', first)
        live = metrics(f"http://127.0.0.1:{port}/metrics")         # the driver's own endpoint
        assert value(live["cerebro_workers_live"], "cerebro_workers_live") == 2
        assert value(live["cerebro_trials"], "cerebro_trials", status="running") >= 1

        seen = epochs_journaled(run_dir)
        hold_at(hold, seen + 2)
        wait_for(lambda: epochs_journaled(run_dir) >= seen + 2 and working(run_dir), "two more epochs")
        second = rendered(chromium, server.url, tmp_path / "profile2")
        later = {trial: int(epochs) for trial, _, epochs in TRIAL_ROW.findall(second)}
        assert sum(later.values()) > sum(trials.values()), (trials, later)
        os.remove(hold)
        assert process.wait(timeout=600) == 0, process.stderr.read()[-3000:]

    result = cb.load(run_dir)
    schedule, history = result.schedule(), result.history()
    done = metrics(server.url + "metrics")                          # the dashboard's, from the run directory
    assert sum(s.value for s in done["cerebro_sub_epochs"] if s.name.endswith("_total")) == len(schedule)
    for (worker, kind), rows in schedule.groupby(["worker", "kind"]):
        assert value(done["cerebro_sub_epochs"], "cerebro_sub_epochs_total", worker=str(worker), kind=kind) == len(rows)
        assert value(done["cerebro_sub_epoch_seconds"], "cerebro_sub_epoch_seconds_count", kind=kind) == \
            (schedule.kind == kind).sum()
    assert value(done["cerebro_epochs"], "cerebro_epochs_total") == len(history) == 12
    assert value(done["cerebro_trials"], "cerebro_trials", status="completed") == 4
    assert value(done["cerebro_workers_live"], "cerebro_workers_live") == 0
    assert value(done["cerebro_best_metric"], "cerebro_best_metric", metric="val_loss") == \
        result.best.best_metrics["val_loss"]
    info = json.loads((tmp_path / "run" / "live.json").read_text())
    assert info["outcome"] == "finished" and info["traffic"]["sent"] > 0
    assert value(done["cerebro_bytes_moved"], "cerebro_bytes_moved_total", path="driver_to_workers") == \
        info["traffic"]["sent"]
    ended = rendered(chromium, server.url, tmp_path / "profile3")
    assert "The run is not running (finished)." in ended and "4 trials: 4 completed" in ended
    server.shutdown()
    server.server_close()


def test_the_server_answers_its_three_routes_and_nothing_else(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    cb.GridSearch(build, {"hidden": cb.choice([8])}, epochs=1).fit(digits(partitions=1, rows=100), workers=1,
                                                                  store=run_dir, seed=0, verbose=0)
    endpoint = MetricsEndpoint(run_dir, 0, announce=True)       # fit(metrics_port=0): a free port, said where
    endpoint.start(run_dir, 1)
    try:
        said = re.fullmatch(r"The run's Prometheus metrics are at http://\S+:(\d+)/metrics\n", capsys.readouterr().err)
        assert said and int(said.group(1)) == endpoint.server.server_address[1] > 0
        assert "cerebro_epochs" in metrics(f"http://127.0.0.1:{said.group(1)}/metrics")
    finally:
        endpoint.finish("finished")
    server = RunServer(run_dir, port=0)
    server.serve_in_thread()
    port = server.server_address[1]
    busy = CliRunner().invoke(main, ["dashboard", run_dir, "--port", str(port)])     # taken: says what to do
    assert (busy.exit_code, busy.output) == (1, f"Error: cannot serve on 127.0.0.1:{port}: Address already in use; "
                                                f"another program (an earlier dashboard?) serves there: choose "
                                                f"another port with --port, e.g. --port {port + 1}, or --port 0 "
                                                f"for any free one\n")
    only_metrics = RunServer(run_dir, port=0, dashboard=False)
    only_metrics.serve_in_thread()
    try:
        for path in ("/run.json", "/journal.jsonl", "/%2e%2e/run.json", "/state/../run.json", "/metrics/x"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(server.url.rstrip("/") + path, timeout=30)
            assert refused.value.code == 404, path
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(server.url + "state", data=b"x", method="POST"), timeout=30)
        assert refused.value.code == 501
        with urllib.request.urlopen(server.url + "state", timeout=30) as answer:
            state = json.loads(answer.read())
        assert sorted(state["sections"]) == ["failures", "headline", "settings", "trials", "workers"]
        assert json.loads(state["figures"]["curves"])["data"]          # the charts, the first time
        with urllib.request.urlopen(server.url + f"state?figures={state['figures_version']}", timeout=30) as answer:
            again = json.loads(answer.read())
        assert again["figures"] is None and again["sections"] == state["sections"]   # not again: nothing new
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(only_metrics.url, timeout=30)
        assert refused.value.code == 404
        assert "cerebro_epochs" in metrics(only_metrics.url + "metrics")
        with urllib.request.urlopen(server.url + f"state?since={state['version']}", timeout=30) as answer:
            assert answer.status == 204           # nothing changed since
        # A live.json written by someone else is shown as nothing, never as markup.
        crafted = {"updated": time.time(), "outcome": None, "alive": [0],
                   "running": {"0": {"trial_id": "<script>alert(1)</script>", "kind": "train", "epoch": "x"}}}
        with open(os.path.join(run_dir, "live.json"), "w") as f:
            json.dump(crafted, f)
        with urllib.request.urlopen(server.url + "state", timeout=30) as answer:
            workers = json.loads(answer.read())["sections"]["workers"]
        assert workers == "<p>live.json is not one a driver wrote; nothing is shown from it.</p>"
        crafted["running"]["0"].update(epoch=1, partition=0, since=time.time(), batches=1, total=2)
        with open(os.path.join(run_dir, "live.json"), "w") as f:
            json.dump(crafted, f)
        with urllib.request.urlopen(server.url + "state", timeout=30) as answer:
            workers = json.loads(answer.read())["sections"]["workers"]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in workers and "<script>" not in workers
        with open(os.path.join(run_dir, "live.json"), "w") as f:
            f.write(json.dumps(crafted).replace('"total": 2', '"total": Infinity'))
        with urllib.request.urlopen(server.url + "state", timeout=30) as answer:
            assert json.loads(answer.read())["sections"]["workers"].startswith("<p>No live state")
        assert "cerebro_epochs" in metrics(only_metrics.url + "metrics")      # scrapes go on
        for host, code in (("evil.example:80", 403), ("[::1", 403), ("localhost", 200), (f"127.0.0.1:{port}", 200)):
            request = urllib.request.Request(server.url + "metrics", headers={"Host": host})
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    status, sniff = answer.status, answer.headers["X-Content-Type-Options"]
            except urllib.error.HTTPError as refused:
                status, sniff = refused.code, refused.headers["X-Content-Type-Options"]
            assert (status, sniff) == (code, "nosniff"), host
    finally:
        for running in (server, only_metrics):
            running.shutdown()
            running.server_close()


def scraped(url: str) -> dict[str, list] | None:
    """The endpoint's metrics, or None while nothing listens there yet."""
    try:
        return metrics(url)
    except (urllib.error.URLError, ConnectionError):
        return None


def test_a_resumed_run_serves_its_metrics_from_where_the_run_was(tmp_path):
    run_dir, hold = str(tmp_path / "run"), str(tmp_path / "hold")
    hold_at(hold, 2)
    with slow_run(tmp_path, free_port(), slow=0.05) as process:
        wait_for(lambda: epochs_journaled(run_dir) >= 2, "two epochs' ends")
        process.kill()                                      # the driver dies: the run is resumable
    before, port = epochs_journaled(run_dir), free_port()
    hold_at(hold, before)                                   # the resumed run waits at its first batch
    cerebro = os.path.join(os.path.dirname(sys.executable), "cerebro")
    resumed = subprocess.Popen([cerebro, "resume", "run", "--quiet", "--metrics-port", str(port)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, counts = f"http://127.0.0.1:{port}/metrics", []

        def counted() -> bool:
            live = scraped(url)
            if live is not None and value(live["cerebro_workers_live"], "cerebro_workers_live") == 2:
                counts.append(value(live["cerebro_epochs"], "cerebro_epochs_total"))
            return len(set(counts)) >= 2 or resumed.poll() is not None
        wait_for(lambda: counted() or bool(counts), "the resumed driver's /metrics")
        hold_at(hold, before + 1)                           # one epoch more, then held again
        wait_for(counted, "the resumed driver's /metrics to count an epoch more")
        os.remove(hold)
        assert resumed.wait(timeout=600) == 0, resumed.stderr.read()[-3000:]
    finally:
        resumed.kill()
        resumed.communicate(timeout=60)
    assert len(set(counts)) >= 2 and before <= counts[0] < counts[-1] <= 12, (before, counts)
    assert len(cb.load(run_dir).history()) == 12


def test_the_dashboard_command_and_fit_refuse_what_they_cannot_serve(tmp_path):
    done = CliRunner().invoke(main, ["dashboard", str(tmp_path / "nothing-here")])
    assert done.exit_code == 1 and done.output == f"Error: {str(tmp_path / 'nothing-here')!r} is not a Cerebro run " \
                                                  f"directory (no run.json)\n"
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=rf"metrics_port={port} cannot be listened on: Address already in use"):
            cb.GridSearch(build, {"hidden": cb.choice([8])}, epochs=1).fit(
                digits(partitions=1, rows=100), workers=1, store=tmp_path / "r", metrics_port=port)
        assert not (tmp_path / "r").exists()      # refused before anything was made
    with pytest.raises(ValueError, match=r"metrics_port=70000 must be a port number \(0: any free port\) or None"):
        cb.GridSearch(build, {"hidden": cb.choice([8])}, epochs=1).fit(digits(partitions=1, rows=100), workers=1,
                                                                      store=tmp_path / "r", metrics_port=70000)
    with pytest.raises(ValueError, match=r"metrics_port=-1 must be a port number \(0: any free port\) or None"):
        cb.resume(tmp_path / "r", metrics_port=-1)

