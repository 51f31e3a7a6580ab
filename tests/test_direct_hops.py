"""Direct hops (issue 34, part 2; DESIGN "Control plane and data plane"): a trial's state goes
from the worker that trained it to the worker that trains it next, the worker that ends an
epoch writes it to the store for the checkpoint (the driver holds its name only), and a state
lost with its worker is recomputed bitwise the same."""
from __future__ import annotations

import functools
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
import cerebro.engine
from cerebro.store import (
    RunStore,
    frames,
    pack_tensors,
    read_state_file,
    remove_state_file,
    unpack_tensors,
    write_state_file,
)
from cerebro.worker._outbox import Outbox
from cerebro.worker._peers import StateServer, fetch
from cerebro.worker._protocol import Fetch, HandedBack
from cerebro.worker._wire import HANDSHAKE_SECONDS, NONCE_BYTES

KEY = b"k" * 32
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}
# States of ~0.5-1 MB, so that the driver's traffic shows whether one of them went through it.
WIDE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([512, 1024])}


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
        search = cb.GridSearch(build, WIDE, epochs=2)
        out[hops] = search.fit(digits(partitions=4), backend=cb.LocalBackend(workers=2, hops=hops), seed=3,
                               verbose=0, store=tmp_path_factory.mktemp("hops") / hops)
    return out


@pytest.mark.slow
def test_direct_hops_give_the_same_bits_as_hops_through_the_driver(hub_and_direct):
    _assert_same(hub_and_direct["direct"], hub_and_direct["driver"])


@pytest.mark.slow
def test_with_direct_hops_no_state_passes_through_the_driver_and_the_workers_files_are_the_checkpoints(
        hub_and_direct):
    def state_bytes(result: cb.Result, trial_id: str) -> int:
        state = unpack_tensors(result.store.read_checkpoint(trial_id))
        tensors = [*state["model"].values(), *(v for s in state["optimizer"]["state"].values() for v in s.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    finished = {name: next(e for e in _journal(r) if e["event"] == "run_finished")
                for name, r in hub_and_direct.items()}
    result = hub_and_direct["driver"]
    train = result.schedule().query("kind == 'train'")
    every_hop = sum(state_bytes(result, t) for t in train.trial_id)    # each train sub-epoch's state
    assert every_hop <= finished["driver"]["bytes_received"] <= every_hop + 1_000_000
    assert finished["driver"]["bytes_between_workers"] == 0
    # Worker to worker, the driver gets the results' sums only: less than one state in all.
    smallest = min(state_bytes(result, t) for t in set(train.trial_id))
    assert finished["direct"]["bytes_received"] < smallest
    assert finished["direct"]["bytes_between_workers"] > 0
    assert hub_and_direct["direct"].bytes_communicated == sum(
        finished["direct"][k] for k in ("bytes_sent", "bytes_received", "bytes_between_workers"))
    direct = hub_and_direct["direct"]
    assert not os.path.exists(os.path.join(direct.run_dir, "staged"))    # the workers' names, gone at the end
    for trial in direct.trials:
        header = direct.store.checkpoints(trial.trial_id)[0]
        assert (header["trial_id"], header["epoch"], header["exploit"]) == (trial.trial_id, 2, False)


@pytest.mark.slow
def test_workers_that_cannot_write_to_the_store_send_their_states_and_the_driver_writes_them(
        tmp_path, monkeypatch, hub_and_direct):
    blocked = tmp_path / "a-file"          # every worker's write there fails: it is no directory
    blocked.write_text("")
    monkeypatch.setattr(RunStore, "staged_state", lambda self, name: str(blocked / f"{name}.state"))
    with pytest.warns(RuntimeWarning, match=r"^worker \d \(pid \d+ on .+\) could not write a state to the store "
                                            r".+ \((FileExistsError|NotADirectoryError): .+\): it sends the states "
                                            r"to the driver, which writes the checkpoints\. Make the store writable "
                                            r"by every worker \(docs/spark\.md\)$"):
        result = cb.GridSearch(build, WIDE, epochs=2).fit(digits(partitions=4), backend=cb.LocalBackend(workers=2),
                                                          seed=3, verbose=0, store=tmp_path / "run")
    _assert_same(result, hub_and_direct["direct"])
    finished = next(e for e in _journal(result) if e["event"] == "run_finished")
    epoch_ends = sum(len(b"".join(map(bytes, frames(result.store.read_checkpoint(t.trial_id))))) * 2
                     for t in result.trials)
    assert finished["bytes_received"] >= epoch_ends     # each epoch's end came to the driver instead


def test_a_workers_state_file_is_taken_as_the_checkpoint_only_whole_and_for_its_trial(tmp_path):
    store = RunStore(tmp_path / "run")
    state = pack_tensors({"w": torch.arange(1000.0)})
    staged = store.staged_state("t0001.7")
    assert staged == str(tmp_path / "run" / "staged" / "t0001.7.state")
    write_state_file(staged, "t0001", 3, state)
    with pytest.raises(ValueError, match=rf"^the state file {staged} is not the one written: its header says "
                                         r"\{.*'trial_id': 't0001', 'epoch': 3.*\}, not \{'trial_id': 't0002', "
                                         r"'epoch': 3, 'format': 'data/1'\}$"):
        store.promote_checkpoint("t0002", staged, 3)
    store.promote_checkpoint("t0001", staged, 3, best=True)
    checkpoint = store.checkpoints("t0001", ("checkpoint.state", "checkpoint.best.state"))
    assert [(c["epoch"], torch.equal(unpack_tensors(c["state"])["w"], torch.arange(1000.0))) for c in checkpoint] \
        == [(3, True), (3, True)]
    assert os.stat(staged).st_ino == os.stat(checkpoint[0]["path"]).st_ino      # a second name, not a copy
    remove_state_file(staged)
    assert torch.equal(unpack_tensors(store.read_checkpoint("t0001"))["w"], torch.arange(1000.0))
    write_state_file(staged, "t0001", 4, state)
    with open(staged, "r+b") as f:         # torn: the header's size is not the file's
        f.truncate(os.path.getsize(staged) - 1)
    with pytest.raises(ValueError, match=rf"^the state file {staged} is not the one written: it is \d+ bytes; "
                                         r"its header says \d+$"):
        store.promote_checkpoint("t0001", staged, 4)


def test_a_symlink_planted_where_states_are_written_or_linked_is_never_followed(tmp_path):
    store = RunStore(tmp_path / "run")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    staged = store.staged_state("t0001.7")
    os.makedirs(os.path.dirname(staged))
    os.symlink(victim, staged + ".tmp")       # where the worker writes before the move
    state = pack_tensors({"w": torch.arange(10.0)})
    write_state_file(staged, "t0001", 1, state)
    assert victim.read_bytes() == b"precious" and not os.path.islink(staged)
    assert torch.equal(unpack_tensors(read_state_file(staged, "t0001", 1))["w"], torch.arange(10.0))
    with pytest.raises(ValueError, match=rf"^the state file {staged} cannot be read: ValueError: its header says "
                                         r"\{.*\}, not \{'trial_id': 't0002', 'epoch': 1, 'format': 'data/1'\}$"):
        read_state_file(staged, "t0002", 1)
    planted = store.staged_state("t0001.8")
    os.symlink(staged, planted)               # a valid state behind it: still not linked as a checkpoint
    with pytest.raises(ValueError, match=rf"^the state file {planted} is not the one written: {planted} is a "
                                         r"symbolic link, not a regular file Cerebro wrote"):
        store.promote_checkpoint("t0001", planted, 1)
    assert not os.path.lexists(os.path.join(store.path, "trials", "t0001", "checkpoint.state"))


def test_clearing_the_staged_states_refuses_a_symlink_in_their_place_and_touches_nothing_it_points_to(tmp_path):
    store = RunStore(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep")
    (elsewhere / "t0000.1.0.state").write_text("keep too")
    os.makedirs(store.path)
    os.symlink(elsewhere, os.path.join(store.path, "staged"))
    with pytest.raises(ValueError, match=r"staged is a symbolic link, where Cerebro keeps a directory of its own"):
        store.clear_staged()
    assert os.path.islink(os.path.join(store.path, "staged"))
    assert sorted(os.listdir(elsewhere)) == ["precious", "t0000.1.0.state"]


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


def dying_in_epoch_two(marker: str, steps_per_epoch: int):
    """``build``, except that the worker running the first batch of the trial's second epoch
    exits (once): the state that batch starts from was in that worker's outbox only, and in
    the file the worker that ended epoch 1 wrote to the store."""
    def build_that_dies(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        loss, optimizer = trainable.loss, trainable.optimizer

        def loss_that_dies(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            taken = max((int(state["step"]) for state in optimizer.state.values()), default=0)
            if taken == steps_per_epoch and claim(marker):
                os._exit(3)
            return loss(outputs, targets)

        trainable.loss = loss_that_dies
        return trainable
    return build_that_dies


@pytest.mark.slow
def test_a_state_lost_at_an_epochs_start_comes_from_the_file_its_worker_wrote_to_the_store_bitwise(tmp_path):
    # Seed 1 visits partition 1 last in epoch 1 and first in epoch 2: one worker ends the
    # first epoch and starts the second, so its exit loses the only copy held by a worker.
    space, seed, data = {"lr": cb.choice([1e-2])}, 1, digits(partitions=2, validation=0.0)
    assert cb.engine.visit_order(seed, "t0000", 1, 2)[-1] == cb.engine.visit_order(seed, "t0000", 2, 2)[0]
    search = functools.partial(cb.GridSearch, space=space, epochs=2, metric="train_loss")
    expected = search(build).fit(data, backend=cb.LocalBackend(2), seed=seed, verbose=0, store=tmp_path / "expected")
    state = unpack_tensors(expected.store.read_checkpoint("t0000"))
    steps = int(next(iter(state["optimizer"]["state"].values()))["step"]) // 2
    result = search(dying_in_epoch_two(str(tmp_path / "died"), steps)).fit(
        data, backend=cb.LocalBackend(2), seed=seed, verbose=0, store=tmp_path / "run")
    assert os.path.exists(tmp_path / "died")
    journal = _journal(result)
    assert [e["event"] for e in journal].count("worker_lost") == 1
    _assert_same(result, expected)
    size = len(b"".join(bytes(frame) for frame in frames(expected.store.read_checkpoint("t0000"))))
    finished = next(e for e in journal if e["event"] == "run_finished")
    assert finished["bytes_sent"] >= size      # the driver read it from the store and sent it
    assert next(e for e in _journal(expected) if e["event"] == "run_finished")["bytes_sent"] < size


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
