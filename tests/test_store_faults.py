"""A store that fails mid-run, and one driver per store of every kind.

A store that turns full or read-only mid-run stops the run with a ``StoreWriteError`` naming
the store and the cause, loses no journaled epoch, and leaves the run resumable to the
results of an undisturbed run, bitwise. The faults are injected where the driver writes
(its file layer), since the tests cannot fill a disk or, as root, make one read-only; the
workers' writes of epoch states fail by being sent where no file can be written.
Remote stores (any fsspec URL; ``memory://`` here) get a renewed lease file instead of the
operating system's lock: a second driver is refused until the lease is given up or runs out,
and of two drivers starting at once only one goes on.
"""
from __future__ import annotations

import errno
import json
import os
import time

import pytest
from _crash import assert_same_results, reference
from _models import digits

import cerebro as cb
from cerebro.store import RunStore, StoreInUseError, _lock
from cerebro.store import _files as files

FAULTS = {   # name -> (errno, what fails, after how many such writes)
    "full": (errno.ENOSPC, ".state", 5),     # any checkpoint file (the best epoch's too)
    "read-only": (errno.EROFS, "journal.jsonl", 100),
}


def failing_after(monkeypatch, fault: str) -> None:
    """From the n-th write of one file kind on, writing it raises what the disk would."""
    code, name, after = FAULTS[fault]
    seen = [0]

    def check(location: str) -> None:
        if location.endswith(name):
            seen[0] += 1
            if seen[0] >= after:
                raise OSError(code, os.strerror(code), location)

    write_atomic, open_file, open_append = files.write_atomic, files.open_file, files.open_append

    def failing_write_atomic(location, *args, **kwargs):
        check(location)
        return write_atomic(location, *args, **kwargs)

    def failing_open_file(location, mode="rb"):
        if "a" in mode or "w" in mode:
            check(location)
        return open_file(location, mode)

    def failing_open_append(location):     # the journal's appends
        check(location)
        return open_append(location)

    monkeypatch.setattr(files, "write_atomic", failing_write_atomic)
    monkeypatch.setattr(files, "open_file", failing_open_file)
    monkeypatch.setattr(files, "open_append", failing_open_append)
    if name == ".state":
        # The workers write the epochs' states (other processes, out of the patch's reach): on
        # a full disk theirs fail first, so they send the states and the driver's write fails.
        # A state file's place where no worker can write stands for that.
        monkeypatch.setattr(RunStore, "staged_state", lambda store, name: os.path.join(
            store.path, "run.json", f"{name}.state"))


def journal(store) -> bytes:
    with open(os.path.join(store, "journal.jsonl"), "rb") as f:
        return f.read()


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_store_that_fails_mid_run_stops_it_clearly_and_it_resumes_to_the_same_results(tmp_path, monkeypatch,
                                                                                           fault):
    store = str(tmp_path / "run")
    backend = cb.LocalBackend(2, threads_per_worker=1)
    with monkeypatch.context() as patch:
        failing_after(patch, fault)
        with pytest.raises(cb.StoreWriteError) as stopped:
            reference("mid-epoch").fit(digits(partitions=4), backend=backend, store=store, seed=5, verbose=0)
    message = str(stopped.value)
    assert stopped.value.errno == FAULTS[fault][0]
    assert message.startswith(f"[Errno {FAULTS[fault][0]}] writing to the store {store!r} failed: ")
    assert os.strerror(FAULTS[fault][0]) in message and f"then cb.resume({store!r})" in message
    before = journal(store)
    journaled = [json.loads(line) for line in before.splitlines()]
    epochs = {(e["trial_id"], e["epoch"]) for e in journaled if e["event"] == "epoch_end"}
    assert epochs and not cb.load(store).finished
    resumed = cb.resume(store, verbose=0)
    assert journal(store).startswith(before)          # nothing journaled was dropped or redone
    history = resumed.history()
    assert epochs <= set(zip(history.trial_id, history.epoch))
    expected = reference("mid-epoch").fit(digits(partitions=4), backend=backend, store=tmp_path / "reference",
                                          seed=5, verbose=0)
    assert_same_results(resumed, expected)


# --- one driver per store ---------------------------------------------------------------------

@pytest.fixture
def remote(request):
    """A fresh store on a file system with no OS lock (fsspec's in-memory one)."""
    path = f"memory://cerebro-lock-test/{request.node.name}"
    yield path
    fs = files._fs(path)[0]
    if fs.exists(path):
        fs.rm(path, recursive=True)


def lease_record(path: str) -> dict:
    with files.open_file(path) as f:
        return json.loads(f.read())


def test_a_remote_store_is_held_by_a_lease_that_a_second_driver_respects(remote):
    lease = RunStore(remote).lock()
    assert isinstance(lease, _lock.Lease)
    record = lease_record(remote + "/.lock")
    assert record["owner"] == lease.owner and record["holder"] == _lock.holder()
    with pytest.raises(StoreInUseError, match=rf"^store '{remote}' is in use by another driver "
                                              rf"\(pid {os.getpid()} on .*, its lease ends .*\); wait for it"):
        RunStore(remote).lock()
    lease.close()
    assert not files.exists(remote + "/.lock")
    RunStore(remote).lock().close()                  # given up: the next driver gets it


def test_a_lease_its_driver_stopped_renewing_runs_out(remote):
    now = [1000.0]
    path = remote + "/.lock"
    dead = _lock.Lease(remote, path, lease_seconds=60, settle_seconds=0, clock=lambda: now[0])
    dead._stop.set()                                  # its driver died: nobody renews it
    dead._renewer.join()
    now[0] += 59
    with pytest.raises(StoreInUseError):
        _lock.Lease(remote, path, lease_seconds=60, settle_seconds=0, clock=lambda: now[0])
    now[0] += 2
    taker = _lock.Lease(remote, path, lease_seconds=60, settle_seconds=0, clock=lambda: now[0])
    assert lease_record(path)["owner"] == taker.owner
    taker.close()


def test_a_lease_renews_itself_before_it_runs_out(remote):
    path = remote + "/.lock"
    lease = _lock.Lease(remote, path, lease_seconds=0.3, settle_seconds=0)    # renewed every 0.1 s
    first = lease_record(path)["expires"]
    deadline = time.monotonic() + 10
    while lease_record(path)["expires"] == first and time.monotonic() < deadline:
        time.sleep(0.01)          # polling for the renewal, with a deadline
    renewed = lease_record(path)["expires"]
    lease.close()
    assert renewed > first


def test_of_two_drivers_starting_at_once_only_the_last_writer_goes_on(remote, monkeypatch):
    """Both found no lease and wrote theirs; the rival's came second, so it is the one there."""
    path = remote + "/.lock"

    def rival_writes_meanwhile(seconds: float) -> None:      # the settle wait of the first driver
        files.write_atomic(path, json.dumps({"owner": "rival", "holder": "pid 1 on other", "expires": 60.0}).encode())

    monkeypatch.setattr(_lock.time, "sleep", rival_writes_meanwhile)
    with pytest.raises(StoreInUseError, match=r"is in use by another driver \(pid 1 on other, its lease ends"):
        _lock.Lease(remote, path, settle_seconds=1.0, clock=lambda: 0.0)
    assert lease_record(path)["owner"] == "rival"


def test_a_local_store_that_cannot_hold_a_lock_file_says_so(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    with pytest.raises(OSError, match=rf"^\[Errno 20\] store '{not_a_directory}' cannot be written "
                                      rf"\(Not a directory: .*\.lock\); choose a writable directory$"):
        RunStore(not_a_directory).lock()
