"""The dashboard's and the driver's HTTP server under attack (DESIGN, invariant 10: no client
can end or stall a run): slow-drip floods, connections beyond the cap, a live.json and a
journal crafted to break the views. Clients connect to 127.0.0.1 only.

A slow-drip client sends one byte of a request that never ends, a second apart: it kept a
timeout per read from ever firing, and a thousand of them took every descriptor of a run's
driver (issue 50).
"""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pandas as pd
import pytest
from _models import build, digits

import cerebro as cb
from cerebro.report import _dashboard
from cerebro.report._http import RunServer, connection_cap

TESTS = os.path.dirname(os.path.abspath(__file__))
DRIP = b"GET /metrics HTTP/1.0\r\nX-Slow: "     # then "a" after "a", never the end of the line
SLACK = 3.0        # seconds a loaded machine may take beyond a deadline
SERVER = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
from cerebro.report._http import RunServer
server = RunServer(sys.argv[1], port=0, deadline={deadline})
server.serve_in_thread()
print(server.server_address[1], server.cap, len(os.listdir("/proc/self/fd")), flush=True)
for line in sys.stdin:      # "N": open N files (what the run may need), say whether it could and what was open
    before = len(os.listdir("/proc/self/fd"))
    try:
        opened = [open(os.devnull) for _ in range(int(line))]
    except OSError as error:
        print(before, error, flush=True)
        continue
    print(before, "opened", flush=True)
    for f in opened:
        f.close()
"""


@pytest.fixture
def run_dir(tmp_path) -> str:
    """A run to serve, made without workers: the committed run of an older version."""
    return str(shutil.copytree(os.path.join(TESTS, "fixtures", "legacy_run"), tmp_path / "run"))


class Flood:
    """Slow-drip clients of ``port``: each sends a byte of :data:`DRIP` a second; what the
    server closes is recorded with how long it stayed open and what it answered."""

    def __init__(self, port: int) -> None:
        self.port, self.last_drip = port, time.monotonic()
        self.open: dict[socket.socket, list] = {}      # socket -> [connected at, bytes sent, answer]
        self.closed: list[tuple[float, bytes]] = []    # (seconds it was open, what the server said)

    def connect(self, clients: int) -> None:
        for _ in range(clients):
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            sock.sendall(DRIP[:1])
            sock.setblocking(False)
            self.open[sock] = [time.monotonic(), 1, b""]

    def step(self) -> None:
        """Wait for answers until the next drip is due (a second after the last), then drip."""
        wait = max(0.0, self.last_drip + 1.0 - time.monotonic())
        readable, _, _ = select.select(list(self.open), [], [], wait) if self.open else ([], [], [])
        for sock in readable:
            try:
                got = sock.recv(65536)
            except ConnectionResetError:
                got = b""
            if got:
                self.open[sock][2] += got
            else:       # the server closed it
                connected, _, answer = self.open.pop(sock)
                self.closed.append((time.monotonic() - connected, answer))
                sock.close()
        if time.monotonic() - self.last_drip >= 1.0:
            self.last_drip = time.monotonic()
            for sock, held in self.open.items():
                try:
                    sock.send(DRIP[held[1]:held[1] + 1] or b"a")
                    held[1] += 1
                except OSError:
                    pass        # closed by the server: the next select reads its end

    def close(self) -> None:
        for sock in self.open:
            sock.close()
        self.open.clear()


def ask(url: str, timeout: float = 30) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_slow_drip_flood_takes_no_descriptor_the_run_needs_and_is_cut_at_the_deadline(run_dir):
    limit, deadline = 256, 5.0
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(limit=limit, deadline=deadline), run_dir],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    flood = None
    try:
        port, cap, baseline = map(int, server.stdout.readline().split())
        assert cap == limit // 16 == 16
        flood = Flood(port)
        flood.connect(300)
        started = time.monotonic()
        while len(flood.open) > cap:     # all but the cap are refused at once
            assert time.monotonic() - started < deadline / 2, (len(flood.open), len(flood.closed))
            flood.step()
        assert len(flood.open) == cap and all(answer.startswith(b"HTTP/1.0 503") or not answer
                                              for _, answer in flood.closed)
        room = limit - baseline - cap - 1       # what the run may open while the endpoint is full
        server.stdin.write(f"{room}\n")
        server.stdin.flush()
        before, said = server.stdout.readline().split(maxsplit=1)
        assert said.strip() == "opened" and int(before) <= baseline + cap
        try:                                     # a scraper meanwhile is answered at once: busy
            assert ask(f"http://127.0.0.1:{port}/metrics", timeout=SLACK)[0] == 503
        except (ConnectionResetError, urllib.error.URLError) as reset:      # or reset, the 503 unread
            assert isinstance(getattr(reset, "reason", reset), ConnectionResetError), reset
        while flood.open:
            assert time.monotonic() - started < deadline + 2 * SLACK, "the drips were not cut at the deadline"
            flood.step()
        held = sorted(lifetime for lifetime, _ in flood.closed)[-cap:]
        assert deadline * 0.95 <= held[0] and held[-1] <= deadline + SLACK, held
        status, text = ask(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"cerebro_epochs_total" in text
    finally:
        if flood is not None:
            flood.close()
        server.kill()
        server.communicate(timeout=60)


def handler_threads() -> int:
    return sum("process_request_thread" in thread.name for thread in threading.enumerate())


def test_a_connection_beyond_the_cap_is_refused_at_once_with_no_thread_and_no_descriptor(run_dir):
    server = RunServer(run_dir, port=0, dashboard=False, max_connections=2, deadline=60)
    server.serve_in_thread()
    port = server.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
    try:
        # One thread accepts, in order, and starts a held connection's thread before it
        # accepts the next: once one beyond is refused, both held ones have their threads.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as first:
            assert first.recv(65536).startswith(b"HTTP/1.0 503 Service Unavailable")
        threads, descriptors = handler_threads(), len(os.listdir("/proc/self/fd"))
        started = time.monotonic()
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as beyond:
                beyond.settimeout(30)
                answer = b"".join(iter(lambda: beyond.recv(65536), b""))     # to the server's close
            assert answer.endswith(b"too many connections; try again\n")
        assert time.monotonic() - started < 30       # refused at once: not at the held ones' deadline
        # No descriptor kept per refusal (the last one's may be closing yet: the client sees
        # the server's FIN from shutdown() before its close()).
        assert handler_threads() == threads == 2 and len(os.listdir("/proc/self/fd")) <= descriptors + 1
        assert select.select(held, [], [], 0)[0] == []       # the held ones are still served
        held[0].sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        held[0].settimeout(30)
        answer = b"".join(iter(lambda: held[0].recv(65536), b""))
        assert answer.startswith(b"HTTP/1.0 200") and b"cerebro_epochs_total" in answer
    finally:
        for sock in held:
            sock.close()
        server.shutdown()
        server.server_close()


def test_the_connection_cap_is_a_small_share_of_the_descriptor_limit():
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert 2 <= connection_cap() <= 32 and (soft == resource.RLIM_INFINITY or connection_cap() <= soft // 16)
    assert connection_cap(4) <= 4


def test_a_metrics_host_that_is_no_address_of_this_machine_is_refused_before_any_work(tmp_path, run_dir, monkeypatch,
                                                                                     capsys):
    from _cli import cerebro
    search = cb.GridSearch(build, {"hidden": cb.choice([8])}, epochs=1)
    for host, why in (("192.0.2.1", "cannot be listened on: Cannot assign requested address"),
                      ("", "must be an address of this machine"), (80, "must be an address of this machine")):
        with pytest.raises(ValueError, match=re.escape(f"metrics_host={host!r} {why}")):
            search.fit(digits(partitions=1, rows=100), workers=1, store=tmp_path / "r", metrics_port=0,
                       metrics_host=host)
        assert not (tmp_path / "r").exists()
    journal = open(os.path.join(run_dir, "journal.jsonl"), "rb").read()
    done = cerebro(monkeypatch, capsys, "resume", run_dir, "--metrics-port", "0", "--metrics-host", "192.0.2.1")
    assert done.returncode == 2 and "error: metrics_host='192.0.2.1' cannot be listened on" in done.stderr
    assert open(os.path.join(run_dir, "journal.jsonl"), "rb").read() == journal     # nothing resumed


@pytest.fixture
def served(run_dir):
    server = RunServer(run_dir, port=0, deadline=5)
    server.serve_in_thread()
    yield server
    server.shutdown()
    server.server_close()


def live(running: dict) -> dict:
    return {"updated": time.time(), "outcome": None, "alive": [0], "traffic": {"sent": 1},
            "running": running}


def doing(**changed) -> dict:
    return {"trial_id": "t0000", "kind": "train", "epoch": 1, "partition": 0, "since": time.time(),
            "batches": 1, "total": 2, **changed}


@pytest.mark.parametrize("crafted", [
    live({"²": doing()}),                                   # str.isdigit() passes it; int() raises
    live({"0" * 5000: doing()}),                            # more digits than int() reads
    live({"0": doing(epoch="1")}),
    live({"0": doing(total=float("inf"))}),                 # written 1e999: json reads it as inf
    {**live({"0": doing()}), "alive": ["0"]},
    {**live({"0": doing()}), "traffic": {"sent": [1]}},
    {**live({"0": doing()}), "outcome": 3},
], ids=["superscript-worker", "long-worker", "string-epoch", "infinite-total", "string-alive", "list-traffic",
        "number-outcome"])
def test_a_crafted_live_json_costs_the_workers_section_only(served, crafted):
    with open(os.path.join(served.view.run_dir, "live.json"), "w") as f:
        f.write(json.dumps(crafted).replace("Infinity", "1e999"))    # a number, not the constant refused
    status, text = ask(served.url + "state")
    assert status == 200
    assert json.loads(text)["sections"]["workers"] == \
        "<p>live.json is not one a driver wrote; nothing is shown from it.</p>"
    status, text = ask(served.url + "metrics")
    assert status == 200 and b"cerebro_epochs_total" in text and b"cerebro_sub_epoch_batches{" not in text


def test_a_live_json_the_checks_let_through_yet_unshowable_still_answers_200(served, monkeypatch):
    monkeypatch.setattr(_dashboard, "well_formed", lambda live: True)     # as if a check missed "²"
    with open(os.path.join(served.view.run_dir, "live.json"), "w") as f:
        json.dump(live({"²": doing()}), f)
    status, text = ask(served.url + "state")
    assert status == 200
    workers = json.loads(text)["sections"]["workers"]
    assert workers.startswith("<p>live.json cannot be shown: ValueError: invalid literal for int()"), workers


def test_a_journal_that_cannot_be_read_answers_503_in_one_line_then_the_run_again(served):
    journal = os.path.join(served.view.run_dir, "journal.jsonl")
    os.rename(journal, journal + ".kept")
    os.mkdir(journal)
    for route in ("state", "metrics"):
        status, text = ask(served.url + route)
        assert status == 503 and re.fullmatch(rb"the run cannot be read now: [^\n]+\n", text), text
        assert b"journal.jsonl" in text
    os.rmdir(journal)
    os.rename(journal + ".kept", journal)
    assert ask(served.url + "state")[0] == 200 and ask(served.url + "metrics")[0] == 200


def test_a_journal_replaced_by_a_fifo_is_an_error_within_the_deadline_then_the_run_again(served):
    journal = os.path.join(served.view.run_dir, "journal.jsonl")
    os.rename(journal, journal + ".kept")
    os.mkfifo(journal)             # opened to read, it would block until a writer came: none does
    try:
        started = time.monotonic()
        for route in ("state", "metrics"):
            status, text = ask(served.url + route, timeout=served.deadline + SLACK)
            assert status == 503 and text.startswith(b"the run cannot be read now: "), text
        assert time.monotonic() - started < 2 * (served.deadline + SLACK)
    finally:
        os.remove(journal)
        os.rename(journal + ".kept", journal)
    status, text = ask(served.url + "state")
    assert status == 200 and "trials" in json.loads(text)["sections"]


FIT = """
import resource, sys
sys.path.insert(0, {tests!r})
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
from _models import build, digits
import cerebro as cb

if __name__ == "__main__":
    search = cb.GridSearch(build, {{"lr": cb.choice([1e-2, 3e-3]), "slow": 0.4}}, epochs=2)
    search.fit(digits(partitions=2), workers=2, store="flooded", seed=0, verbose=1, metrics_port=0)
"""
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "slow": 0.4}      # FIT's


@pytest.mark.slow
def test_a_run_under_a_slow_drip_flood_on_its_metrics_port_ends_as_an_undisturbed_one(tmp_path):
    """Before issue 50, 1,000 such clients took every descriptor of a driver under ulimit -n
    1024, and its next journal write failed the run (EMFILE)."""
    limit = 256
    (tmp_path / "fit.py").write_text(FIT.format(tests=TESTS, limit=limit))
    run = subprocess.Popen([sys.executable, "fit.py"], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    said, listening = [], threading.Event()

    def reading() -> None:        # the run's stderr, drained so it never blocks, until it says its port
        for line in run.stderr:
            said.append(line)
            if "Prometheus metrics are at" in line:
                listening.set()
        listening.set()           # or it ended without
    threading.Thread(target=reading, daemon=True).start()
    assert listening.wait(300) and "Prometheus metrics are at" in "".join(said), "".join(said)[-3000:]
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", "".join(said)).group(1))
    flood, refused, refilled = Flood(port), 0, 0.0
    try:
        started = time.monotonic()
        while run.poll() is None:     # 400 slow clients, more than the driver's descriptors, each second anew
            assert time.monotonic() - started < 600, "the run did not end under the flood"
            if time.monotonic() - refilled >= 1.0:
                refilled = time.monotonic()
                try:
                    flood.connect(400 - len(flood.open))
                except ConnectionRefusedError:      # the run ended, and its server with it
                    break
            flood.step()
            refused += sum(answer.startswith(b"HTTP/1.0 503") for _, answer in flood.closed)
            flood.closed.clear()
    finally:
        flood.close()
    assert run.wait(timeout=300) == 0, "".join(said)[-3000:]
    flooded_for = time.monotonic() - started
    assert flooded_for > 10 and refused > 1000, (flooded_for, refused)    # beyond the cap, past a deadline
    quiet = cb.GridSearch(build, SPACE, epochs=2).fit(digits(partitions=2), workers=2, store=tmp_path / "quiet",
                                                      seed=0, verbose=0)
    pd.testing.assert_frame_equal(cb.load(tmp_path / "flooded").history(), quiet.history(), check_exact=True)


def raw_status(url: str, headers: list[tuple[str, str]]) -> int:
    """The status of a GET of ``url`` sent with exactly ``headers`` (repeats and all)."""
    return raw_answer(url, headers)[0]


def raw_answer(url: str, headers: list[tuple[str, str]]) -> tuple[int, bytes]:
    """The status and body of a GET of ``url`` sent with exactly ``headers``."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        lines = [f"GET {parts.path or '/'} HTTP/1.1", *(f"{k}: {v}" for k, v in headers), "Connection: close"]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize(("hosts", "code"), [
    (["127.0.0.1:99999999"], 403), (["127.0.0.1/evil.com"], 403), (["127.0.0.1#.evil.com"], 403),
    (["evil.com@127.0.0.1"], 403), (["127.0.0.1", "evil.com"], 403), ([], 403),
    (["[::ffff:127.0.0.1]:80"], 200), (["localhost."], 200), (["LOCALHOST:8265"], 200)])
def test_a_loopback_server_answers_only_a_request_naming_one_loopback_host_exactly(served, hosts, code):
    status, body = raw_answer(served.url + "metrics", [("Host", h) for h in hosts])
    assert status == code
    if code == 403:
        assert body == b"this server answers requests addressed to 127.0.0.1 or localhost only\n"


def test_a_server_on_the_ipv6_loopback_names_its_own_address_in_a_refusal(run_dir):
    server = RunServer(run_dir, host="::1", port=0, deadline=5)
    server.serve_in_thread()
    try:
        url = f"http://[::1]:{server.server_address[1]}/metrics"
        assert raw_status(url, [("Host", "[::1]")]) == 200
        assert raw_answer(url, [("Host", "evil.example")]) == (    # it said 127.0.0.1, where it does not listen
            403, b"this server answers requests addressed to [::1] or localhost only\n")
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_on_every_interface_answers_addresses_and_its_own_names_not_a_rebound_one(run_dir):
    """0.0.0.0 listens on the loopback too: a page at evil.example resolved to 127.0.0.1 must
    not read the run through it (traffic here stays on 127.0.0.1)."""
    server = RunServer(run_dir, host="0.0.0.0", port=0, deadline=5)     # noqa: S104 (what is tested)
    server.serve_in_thread()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        for host, code in (("evil.example", 403), ("evil.example:80", 403), ("127.0.0.1", 200),
                           ("10.1.2.3:9100", 200), (socket.gethostname(), 200), (socket.getfqdn(), 200)):
            assert raw_status(url, [("Host", host)]) == code, host
        assert raw_answer(url, [("Host", "evil.example")])[1] == (
            b"this server answers requests addressed to one of this machine's IP addresses or names only (one Host "
            b"header: host[:port])\n")      # not the loopback's rule, which this server does not follow
    finally:
        server.shutdown()
        server.server_close()


def test_a_scraper_in_a_loop_makes_the_journal_be_read_again_at_most_once_in_five_reads_time(tmp_path):
    """A journal that changes every sub-epoch: each scrape would read it whole. A result is
    served for five times its read's duration, so the reads take at most a fifth of a core."""
    from cerebro.report._prometheus import FRESH_FOR, Reread
    journal = tmp_path / "journal.jsonl"
    journal.write_bytes(b"")
    reads: list[tuple[float, float]] = []

    def read() -> int:
        started = time.monotonic()
        while time.monotonic() - started < 0.02:      # a read that costs 20 ms of CPU
            pass
        reads.append((started, time.monotonic()))
        return len(reads)
    cached = Reread(str(tmp_path), read)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        with open(journal, "ab") as f:                 # the run goes on: the journal changes each time
            f.write(b"x\n")
        cached.get()
    busy = sum(end - start for start, end in reads)
    assert len(reads) >= 2 and busy <= 2.0 / (FRESH_FOR - 1)
    assert all(later[0] - earlier[1] >= (FRESH_FOR - 1) * (earlier[1] - earlier[0]) * 0.99
               for earlier, later in zip(reads, reads[1:]))
