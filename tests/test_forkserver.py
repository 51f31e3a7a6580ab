"""The local backend's fork server: workers forked with torch (and, for a Keras run, Keras on
the run's backend) already imported, seen by the backend as processes it started itself, in
the driver's environment, directory and path as they are when each run starts; a killed
server is replaced, its workers not left behind."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import psutil
import pytest
import torch
from _models import build, digits

import cerebro as cb
from cerebro.backends import _forks

pytestmark = pytest.mark.skipif(not _forks.AVAILABLE, reason="the fork server runs on Linux only")

SPACE = {"lr": cb.choice([3e-2, 1e-2]), "hidden": cb.choice([16, 32])}


def _epoll_watches() -> list[int]:
    """The inodes of the files every epoll descriptor this process holds watches."""
    watched = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]":
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    watched += [int(m, 16) for m in re.findall(r"\bino:([0-9a-f]+)", info.read())]
    return watched


def seen_by_the_worker(path: str, base=build):
    """``base``, which writes where it runs (its parent's pid and command line, directory, an
    environment variable, whether the driver's path is on sys.path) to ``path``, once per worker."""
    def build_that_looks(config: dict):
        me = psutil.Process()
        if me.name() == "cerebro-worker":
            with open(os.path.join(path, str(os.getpid())), "w") as f:
                json.dump({"cwd": os.getcwd(), "env": os.environ.get("CEREBRO_FORK_TEST"), "parent": me.ppid(),
                           "command": me.parent().cmdline(), "threads": torch.get_num_threads(),
                           "path": os.path.dirname(__file__) in sys.path, "watched": _epoll_watches(),
                           "parents_stdin": os.stat(f"/proc/{me.ppid()}/fd/0").st_ino}, f)
        return base(config)
    return build_that_looks


@pytest.mark.slow
def test_workers_are_forked_in_the_drivers_environment_directory_and_path_as_each_run_starts(
        tmp_path, monkeypatch):
    seen = []
    for run, value in enumerate(["first", "second"]):
        where = tmp_path / f"seen{run}"
        where.mkdir()
        (tmp_path / value).mkdir()
        monkeypatch.chdir(tmp_path / value)
        monkeypatch.setenv("CEREBRO_FORK_TEST", value)
        result = cb.GridSearch(seen_by_the_worker(str(where)), SPACE, epochs=1).fit(
            digits(partitions=2), backend=cb.LocalBackend(2, threads_per_worker=1), store=tmp_path / f"run{run}",
            seed=0, verbose=0)
        assert result.finished
        seen.append([json.load(open(where / name)) for name in sorted(os.listdir(where))])
    for run, value in enumerate(["first", "second"]):
        assert len(seen[run]) == 2       # each worker of each run, named cerebro-worker
        assert {s["cwd"] for s in seen[run]} == {str(tmp_path / value)}
        assert {(s["env"], s["threads"], s["path"]) for s in seen[run]} == {(value, 1, True)}
        # The server's epoll (which watches its stdin) is not the worker's: closed at the fork.
        assert not any(s["parents_stdin"] in s["watched"] for s in seen[run])
    servers = {s["parent"] for run in seen for s in run}    # one server forked all four
    assert len(servers) == 1 and psutil.Process(servers.pop()).name() == "cerebro-forksrv"


@pytest.mark.slow
def test_forked_workers_give_the_bits_of_workers_started_as_programs(tmp_path, monkeypatch):
    forked = cb.GridSearch(build, SPACE, epochs=2).fit(digits(), backend=cb.LocalBackend(2, threads_per_worker=1),
                                                      store=tmp_path / "forked", seed=3, verbose=0)
    monkeypatch.setattr(_forks, "AVAILABLE", False)
    started = cb.GridSearch(build, SPACE, epochs=2).fit(digits(), backend=cb.LocalBackend(2, threads_per_worker=1),
                                                       store=tmp_path / "started", seed=3, verbose=0)
    assert forked.history().equals(started.history())
    for a, b in zip(forked.trials, started.trials):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def _server_of_this_process(keras: str | None = None) -> _forks.ForkServer:
    server = _forks._SERVERS.get(keras)
    assert server is not None and server.owner == os.getpid()
    return server


@pytest.mark.slow
def test_a_keras_runs_workers_are_forked_with_keras_on_its_backend_and_give_the_bits_of_started_ones(
        tmp_path, monkeypatch):
    keras = pytest.importorskip("keras")
    from _keras_models import build as keras_build
    seen = tmp_path / "seen"
    seen.mkdir()
    space = {"architecture": cb.choice(["mlp", "cnn"])}
    forked = cb.GridSearch(seen_by_the_worker(str(seen), keras_build), space, epochs=2).fit(
        digits(partitions=2, rows=300), backend=cb.LocalBackend(2, threads_per_worker=1), store=tmp_path / "forked",
        seed=3, verbose=0)
    server = _server_of_this_process(keras.backend.backend())
    parents = [json.load(open(seen / name)) for name in os.listdir(seen)]
    assert len(parents) == 2       # both forked by the server that imported Keras on the run's backend
    assert {(p["parent"], p["command"][3], p["command"][-1]) for p in parents} == \
        {(server._process.pid, "cerebro.worker._forkserver", keras.backend.backend())}
    monkeypatch.setattr(_forks, "AVAILABLE", False)
    started = cb.GridSearch(keras_build, space, epochs=2).fit(
        digits(partitions=2, rows=300), backend=cb.LocalBackend(2, threads_per_worker=1), store=tmp_path / "started",
        seed=3, verbose=0)
    assert forked.history().equals(started.history())
    for a, b in zip(forked.trials, started.trials):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def _gone(pid: int) -> bool:
    try:
        psutil.Process(pid).wait(timeout=10)      # reaped by whoever inherited it
    except psutil.NoSuchProcess:
        pass
    return not psutil.pid_exists(pid)


@pytest.mark.slow
def test_a_killed_fork_server_takes_its_workers_along_and_the_next_run_starts_a_new_one(tmp_path):
    first = cb.GridSearch(build, SPACE, epochs=1).fit(digits(partitions=2), backend=cb.LocalBackend(2),
                                                     store=tmp_path / "a", seed=0, verbose=0)
    server = _server_of_this_process()
    silent = socket.create_server(("127.0.0.1", 0))      # takes connections, answers nothing: workers wait
    nowhere = silent.getsockname()
    waiting = server.spawn(0, nowhere, b"k" * 32, dict(os.environ))
    assert waiting.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        waiting.wait(timeout=0.2)
    waiting.kill()
    assert waiting.wait(timeout=30) == -signal.SIGKILL and waiting.poll() == -signal.SIGKILL
    orphan = server.spawn(1, nowhere, b"k" * 32, dict(os.environ))
    os.kill(server._process.pid, signal.SIGKILL)
    assert orphan.wait(timeout=30) == -signal.SIGKILL and _gone(orphan.pid)      # not left running unwatched
    silent.close()
    second = cb.GridSearch(build, SPACE, epochs=1).fit(digits(partitions=2), backend=cb.LocalBackend(2),
                                                      store=tmp_path / "b", seed=0, verbose=0)
    assert _server_of_this_process() is not server
    assert second.history().equals(first.history())


@pytest.mark.slow
def test_a_worker_asked_for_just_after_its_server_was_killed_comes_from_a_new_one():
    env = dict(os.environ)
    killed = _forks.server(env)
    os.kill(killed._process.pid, signal.SIGKILL)
    killed._process.wait()              # dead, its stdin without a reader, whatever the backend saw yet
    silent = socket.create_server(("127.0.0.1", 0))     # the worker waits there, answered by nothing
    worker = _forks.fork_worker(0, silent.getsockname(), b"k" * 32, env)
    try:
        replacement = _server_of_this_process()
        assert replacement is not killed and psutil.Process(worker.pid).ppid() == replacement._process.pid
    finally:
        worker.kill()
        worker.wait(30)
        silent.close()


def test_the_server_signals_only_its_own_unreaped_workers_and_ends_with_its_stdin(tmp_path):
    """A request naming any other pid does nothing; stdin's end (the driver gone) ends it."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    read_fd, write_fd = os.pipe()
    server = subprocess.Popen([sys.executable, "-m", "cerebro.worker._forkserver", str(write_fd)],
                              stdin=subprocess.PIPE, pass_fds=(write_fd,))
    os.close(write_fd)
    try:
        assert server.stdin is not None
        server.stdin.write(json.dumps({"signal": signal.SIGKILL, "pid": bystander.pid}).encode() + b"\n")
        server.stdin.close()                   # the driver's end
        assert server.wait(timeout=60) == 0
        assert os.read(read_fd, 100) == b""    # it wrote no event: it forked nothing
        assert bystander.poll() is None        # never signalled
    finally:
        os.close(read_fd)
        bystander.kill()
        bystander.wait()



def test_a_pid_the_kernel_reuses_is_a_new_worker_not_the_one_that_exited_with_it():
    """The server's replies in the order it writes them: a worker forked as pid 4242 exits
    with code 3, and a later worker gets pid 4242 again (32,768 pids, a long-lived server).
    The new one is live and the old one exited 3; keyed by pid alone, the new one was taken
    for exited ("worker 0 exited with code 3 while starting")."""
    server = _forks.ForkServer.__new__(_forks.ForkServer)      # its bookkeeping, with no process
    server._changed = threading.Condition()
    server._pids, server._spawned, server._codes, server._live = [], {}, {}, set()
    server._take({"pid": 4242})
    old = _forks.ForkedWorker(server, *server._pids.pop(0))
    server._take({"exited": 4242, "code": 3})
    server._take({"pid": 4242})
    new = _forks.ForkedWorker(server, *server._pids.pop(0))
    assert (old.pid, old.serial, old.poll()) == (4242, 1, 3)
    assert (new.pid, new.serial, new.poll()) == (4242, 2, None) and server._live == {4242}
    server._take({"exited": 4242, "code": 0})
    assert (old.wait(0), new.wait(0)) == (3, 0)
