"""Direct hops (issue 34, part 2; DESIGN "Control plane and data plane"): a trial's state goes
from the worker that trained it to the worker that trains it next, the driver gets it once per
epoch for the checkpoint, and a state lost with its worker is recomputed bitwise the same."""
from __future__ import annotations

import json
import os
import signal
import socket
import time

import pandas as pd
import psutil
import pytest
import torch
from _faults import claim
from _models import build, digits

import cerebro as cb
from cerebro.store import pack_tensors, unpack_tensors
from cerebro.worker._outbox import Outbox
from cerebro.worker._peers import StateServer, fetch
from cerebro.worker._protocol import Fetch, HandedBack
from cerebro.worker._wire import HANDSHAKE_SECONDS, NONCE_BYTES

KEY = b"k" * 32
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}


# --- the outbox and its server --------------------------------------------------------------
def _state(value: float, size: int = 1000) -> dict:
    return pack_tensors({"w": torch.full((size,), value)})


def _tensor(outbox: Outbox, trial_id: str, version: int) -> torch.Tensor:
    from cerebro.store import parse_view
    return unpack_tensors(parse_view(memoryview(bytearray(outbox.get(trial_id, version)))))["w"]


def test_the_outbox_keeps_each_state_until_forgotten_and_the_oldest_on_disk_past_its_budget():
    outbox = Outbox(budget=10_000)          # room for two states of ~4 kB in memory
    try:
        assert outbox.put("t0", 1, _state(1.0)) == ()
        assert outbox.put("t0", 2, _state(2.0)) == ()      # version 1 stays until forgotten
        outbox.forget("t0", 1)
        assert outbox.get("t0", 1) is None and torch.equal(_tensor(outbox, "t0", 2), torch.full((1000,), 2.0))
        outbox.put("t1", 1, _state(3.0))
        assert outbox.put("t2", 1, _state(4.0)) == () and outbox.spilled == 1     # the oldest, t0's
        files = [name for name in os.listdir(outbox._directory) if name.endswith(".state")]
        assert len(files) == 1 and oct(os.stat(outbox._directory).st_mode & 0o777) == "0o700"
        assert torch.equal(_tensor(outbox, "t0", 2), torch.full((1000,), 2.0))    # read back from disk
        path = os.path.join(outbox._directory, files[0])
        with open(path, "r+b") as f:        # one flipped byte: that state is not sent
            f.seek(-5, os.SEEK_END)
            byte = f.read(1)
            f.seek(-5, os.SEEK_END)
            f.write(bytes([byte[0] ^ 1]))
        assert outbox.get("t0", 2) is None
        outbox.forget("t0", 2)
        assert os.listdir(outbox._directory) == ["owner"]        # the lock of the scratch directory
    finally:
        directory = outbox._directory
        outbox.close()
    assert not os.path.exists(directory)
    assert not os.path.exists(outbox._directory)


def test_where_the_disk_fails_the_outbox_hands_its_oldest_states_back_to_the_driver(caplog):
    outbox = Outbox(budget=5_000)
    outbox._directory = "/dev/null/cerebro"       # not a directory: every write fails
    outbox.put("t0", 1, _state(1.0))
    outbox.put("t1", 1, _state(2.0))          # t0's goes back, with the next reservation
    assert outbox.get("t0", 1) is None
    handed = outbox.reserve("t2", 1)
    assert [(h.trial_id, h.version) for h in handed] == [("t0", 1)] and isinstance(handed[0], HandedBack)
    assert torch.equal(unpack_tensors(handed[0].state)["w"], torch.full((1000,), 1.0))
    assert [r.getMessage() for r in caplog.records] == [
        "could not write t0's state 1 to local disk ([Errno 20] Not a directory: '/dev/null/cerebro/0.state'): it goes "
        "back to the driver"]


def test_the_outbox_keeps_a_copy_the_trainer_cannot_change():
    tensor = torch.zeros(100)
    outbox = Outbox(budget=1 << 20)
    outbox.put("t0", 1, pack_tensors({"w": tensor}))
    tensor += 1                             # the trainer goes on training in place
    server = StateServer("127.0.0.1", KEY, outbox)
    try:
        state, size = fetch(server.address, KEY, "t0", 1)
        assert torch.equal(unpack_tensors(state)["w"], torch.zeros(100)) and size > 400
        assert fetch(server.address, KEY, "t0", 2)[0] is None       # not that version
    finally:
        server.close()


def test_a_peer_without_the_token_gets_no_state():
    outbox = Outbox(budget=1 << 20)
    outbox.put("t0", 1, _state(5.0))
    server = StateServer("127.0.0.1", KEY, outbox)
    try:
        with pytest.raises(PermissionError):
            fetch(server.address, b"x" * 32, "t0", 1, timeout=5)
        # An attacker who skips the handshake and asks at once reads only the server's nonce,
        # then the connection closes within the handshake's deadline.
        from cerebro.store import frames
        with socket.create_connection(server.address, timeout=5) as sock:
            sock.sendall(b"".join(bytes(f) for f in frames(Fetch("t0", 1))))
            received, started = b"", time.monotonic()
            try:
                while chunk := sock.recv(1 << 16):
                    received += chunk
            except ConnectionResetError:    # closed with the request unread
                pass
            assert len(received) <= NONCE_BYTES + 2            # its nonce, maybe its refusal: no state
            assert time.monotonic() - started < HANDSHAKE_SECONDS + 2
        # A proof made for the driver's port is not valid between workers.
        from cerebro.worker._wire import _DRIVER, _WORKER, Channel, _proof
        with socket.create_connection(server.address, timeout=5) as sock:
            nonce = Channel(sock)._read(NONCE_BYTES, time.monotonic() + 5)
            sock.sendall(_proof(KEY, _WORKER, bytes(nonce)))
            assert sock.recv(2) == b"no" and _DRIVER
    finally:
        server.close()


def test_hops_is_checked_where_the_backend_is_made():
    with pytest.raises(ValueError, match=r"^hops='peer' is not one of \['direct', 'driver'\]: \"direct\" sends "
                                         r"states worker to worker, \"driver\" through the driver$"):
        cb.LocalBackend(workers=2, hops="peer")
    assert repr(cb.LocalBackend(2, hops="driver")) == "LocalBackend(workers=2, threads_per_worker=1, hops='driver')"


# --- whole runs ---------------------------------------------------------------------------
def _journal(result: cb.Result) -> list[dict]:
    with open(os.path.join(result.run_dir, "journal.jsonl")) as f:
        return [json.loads(line) for line in f]


def _assert_same(a: cb.Result, b: cb.Result) -> None:
    pd.testing.assert_frame_equal(a.history(), b.history(), check_exact=True)
    for x, y in zip(a.trials, b.trials):
        assert (x.trial_id, x.status) == (y.trial_id, y.status)
        for epoch in ("best", "last"):
            assert all(torch.equal(v, y.state_dict(epoch)[k]) for k, v in x.state_dict(epoch).items())


@pytest.fixture(scope="module")
def hub_and_direct(tmp_path_factory: pytest.TempPathFactory) -> dict[str, cb.Result]:
    out = {}
    for hops in ("driver", "direct"):
        search = cb.GridSearch(build, SPACE, epochs=2)
        out[hops] = search.fit(digits(partitions=4), backend=cb.LocalBackend(workers=2, hops=hops), seed=3,
                               verbose=0, store=tmp_path_factory.mktemp("hops") / hops)
    return out


@pytest.mark.slow
def test_direct_hops_give_the_same_bits_as_hops_through_the_driver(hub_and_direct):
    _assert_same(hub_and_direct["direct"], hub_and_direct["driver"])


@pytest.mark.slow
def test_with_direct_hops_the_driver_gets_each_state_once_per_epoch(hub_and_direct):
    def state_bytes(result: cb.Result, trial_id: str) -> int:
        state = unpack_tensors(result.store.read_checkpoint(trial_id))
        tensors = [*state["model"].values(), *(v for s in state["optimizer"]["state"].values() for v in s.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    finished = {name: next(e for e in _journal(r) if e["event"] == "run_finished")
                for name, r in hub_and_direct.items()}
    result = hub_and_direct["driver"]
    train = result.schedule().query("kind == 'train'")
    every_hop = sum(state_bytes(result, t) for t in train.trial_id)    # each train sub-epoch's state
    epoch_ends = every_hop // 4                                        # 4 partitions: one in 4
    assert every_hop <= finished["driver"]["bytes_received"] <= every_hop + 3_000_000
    assert finished["driver"]["bytes_between_workers"] == 0
    assert epoch_ends <= finished["direct"]["bytes_received"] <= epoch_ends + 3_000_000
    assert finished["direct"]["bytes_between_workers"] > 0
    assert hub_and_direct["direct"].bytes_communicated == sum(
        finished["direct"][k] for k in ("bytes_sent", "bytes_received", "bytes_between_workers"))


def killing_the_holder(marker_dir: str):
    """``build``, except that its second call in a worker (the worker that trains the trial's
    second sub-epoch, about to fetch the state from the first) kills every other worker with
    SIGKILL: the only copy of that state is lost with them."""
    def build_that_kills(config: dict) -> cb.TorchTrainable:
        me = psutil.Process()
        in_worker = "cerebro.worker" in " ".join(me.cmdline())      # not the driver's own checks
        if in_worker and not claim(os.path.join(marker_dir, "first")) and claim(os.path.join(marker_dir, "second")):
            for sibling in me.parent().children():
                if sibling.pid != me.pid and "cerebro.worker" in " ".join(sibling.cmdline()):
                    os.kill(sibling.pid, signal.SIGKILL)
                    sibling.wait(10)
        return build(config)
    return build_that_kills


@pytest.mark.slow
def test_a_state_lost_with_its_worker_is_recomputed_from_the_driver_copy_bitwise(tmp_path):
    space = {"lr": cb.choice([1e-2])}
    expected = cb.GridSearch(build, space, epochs=2).fit(digits(partitions=2), backend=cb.LocalBackend(2), seed=5,
                                                         verbose=0, store=tmp_path / "expected")
    result = cb.GridSearch(killing_the_holder(str(tmp_path)), space, epochs=2).fit(
        digits(partitions=2), backend=cb.LocalBackend(2), seed=5, verbose=0, store=tmp_path / "run")
    assert os.path.exists(tmp_path / "second")
    journal = _journal(result)
    lost = [e for e in journal if e["event"] == "state_lost"]
    first = cb.engine.visit_order(5, "t0000", 1, 2)[0]
    assert [(e["trial_id"], e["epoch"], e["partitions"]) for e in lost] == [("t0000", 1, [first])]
    assert "could not fetch it" in lost[0]["reason"] or "exited" in lost[0]["reason"]
    assert any(e["event"] == "worker_lost" for e in journal)
    _assert_same(result, expected)
    trained = [e for e in journal if e["event"] == "sub_epoch" and e["kind"] == "train" and e["trial_id"] == "t0000"
               and e["epoch"] == 1 and e["partition"] == first]
    assert len(trained) == 2                  # trained again; the schedule keeps the run that counts
    assert len(result.schedule().query(f"kind == 'train' and epoch == 1 and partition == {first}")) == 1
    from click.testing import CliRunner

    from cerebro.cli import main
    shown = CliRunner().invoke(main, ["status", result.run_dir])
    assert shown.exit_code == 0 and "\ntrial states lost with their workers and recomputed: 1\n" in shown.output


def unreachable_peers(config: dict) -> cb.TorchTrainable:
    """``build``, except that a worker's first call closes its state server: the others can
    no longer fetch from it, while it still answers the driver (as behind a firewall)."""
    import gc

    from cerebro.worker._peers import StateServer
    for server in [o for o in gc.get_objects() if type(o) is StateServer]:
        server.close()
    return build(config)


@pytest.mark.slow
def test_workers_that_cannot_reach_each_other_fall_back_to_hops_through_the_driver(tmp_path, caplog):
    expected = cb.GridSearch(build, SPACE, epochs=2).fit(digits(partitions=4), backend=cb.LocalBackend(2), seed=4,
                                                         verbose=0, store=tmp_path / "expected")
    with caplog.at_level("WARNING", logger="cerebro"):
        result = cb.GridSearch(unreachable_peers, SPACE, epochs=2).fit(
            digits(partitions=4), backend=cb.LocalBackend(2), seed=4, verbose=0, store=tmp_path / "run")
    warnings = [r.getMessage() for r in caplog.records if "cannot reach each other" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectionRefusedError" in warnings[0]
    assert warnings[0].endswith('so every hop goes through the driver from now on (set the backend\'s '
                                'hops="driver" to start so)')
    assert not any(e["event"] == "worker_lost" for e in _journal(result))
    _assert_same(result, expected)
