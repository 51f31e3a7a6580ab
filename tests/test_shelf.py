"""The driver's state shelf: at most ``resident`` states in memory, the rest on local disk and
read back bitwise; a spilled state's file lives as long as something refers to it."""
from __future__ import annotations

import gc
import os
import re

import pytest
import torch

from cerebro.engine._shelf import StateShelf
from cerebro.store import pack_tensors, unpack_tensors


def state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return pack_tensors({"model": {"w": torch.randn(64, 32, generator=generator),
                                   "b": torch.randn(32, generator=generator).to(torch.bfloat16)},
                         "optimizer": {"step": seed, "lr": 0.1 * seed}})


def same(a: dict, b: dict) -> bool:
    a, b = unpack_tensors(a), unpack_tensors(b)
    return all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]) and a["optimizer"] == b["optimizer"]


def test_the_states_beyond_the_first_resident_ones_wait_on_disk_and_read_back_bitwise(tmp_path):
    """The oldest stay in memory: MOP serves waiting trials in turn, so they are used first."""
    shelf = StateShelf(resident=2, directory=str(tmp_path))
    shelved = [shelf.put(state(i)) for i in range(5)]
    shelf.close()                                   # the spills written
    assert [s.in_memory for s in shelved] == [True, True, False, False, False]
    assert shelf.spilled == 3 and len(os.listdir(tmp_path)) == 3
    assert all(same(s.get(), state(i)) for i, s in enumerate(shelved))
    assert [s.in_memory for s in shelved] == [True, True, False, False, False]     # read, not taken back in


def test_a_spilled_states_file_goes_when_nothing_refers_to_it(tmp_path):
    shelf = StateShelf(resident=1, directory=str(tmp_path))
    first = shelf.put(state(0))
    second = shelf.put(state(1))
    shelf.close()
    assert first.in_memory and not second.in_memory and len(os.listdir(tmp_path)) == 1
    del second
    gc.collect()
    assert os.listdir(tmp_path) == []


def test_a_state_let_go_of_leaves_room_for_the_next(tmp_path):
    """A trial that ended frees its place: the states still held stay in memory."""
    shelf = StateShelf(resident=2, directory=str(tmp_path))
    kept = shelf.put(state(0))
    ended = shelf.put(state(1))
    del ended
    gc.collect()
    newest = shelf.put(state(2))
    shelf.close()
    assert kept.in_memory and newest.in_memory and shelf.spilled == 0


def test_without_a_bound_nothing_is_spilled_and_close_removes_the_directory_it_made():
    shelf = StateShelf()
    held = [shelf.put(state(i)) for i in range(20)]
    assert all(s.in_memory for s in held) and shelf.spilled == 0
    bounded = StateShelf(resident=1)
    spilled = [bounded.put(state(i)) for i in range(3)]
    bounded.close()
    directory = os.path.dirname(spilled[2]._path)
    assert os.path.basename(directory).startswith("cerebro-states-") and not os.path.exists(directory)


@pytest.mark.parametrize("bad", [0, -3])
def test_a_shelf_that_holds_no_state_is_refused(bad):
    with pytest.raises(ValueError, match=re.escape(f"resident={bad!r} must be a positive number of states, or None")):
        StateShelf(resident=bad)


def test_a_checkpoint_waits_while_the_store_is_behind_by_the_bound():
    """Back-pressure: with two checkpoint writes queued on a stuck store, a third waits until
    one is written; the journal's small writes never wait."""
    import threading

    from cerebro.engine._writer import BackgroundWriter
    writer = BackgroundWriter("store", max_heavy=2)
    gate, order = threading.Event(), []
    for _ in range(2):
        writer.submit(gate.wait, heavy=True)
    writer.submit(order.append, "journal line")          # not heavy: queued at once
    third = threading.Thread(target=lambda: (writer.submit(order.append, "third checkpoint", heavy=True),
                                             order.append("third queued")))
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive() and order == []         # blocked on the bound, not on a lock: it would return at once
    gate.set()
    third.join()
    writer.close()
    assert order == ["journal line", "third queued", "third checkpoint"] or \
        order == ["journal line", "third checkpoint", "third queued"]
    assert writer._heavy == 0


@pytest.mark.slow
def test_a_run_whose_states_wait_on_disk_equals_one_that_holds_them_all(tmp_path, monkeypatch):
    from _models import build, digits

    import cerebro as cb
    from cerebro.engine import _driver
    shelves = []

    def recording(resident):
        shelves.append(StateShelf(resident=resident))
        return shelves[-1]

    monkeypatch.setattr(_driver, "StateShelf", recording)
    search = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-3, 1e-3]), "hidden": cb.choice([8, 16])}, epochs=2)
    results = []
    for per_worker in (1, 1000):
        monkeypatch.setattr(_driver, "RESIDENT_STATES_PER_WORKER", per_worker)
        # Every hop through the driver: the most states on its shelf (direct hops bring it one per epoch).
        results.append(search.fit(digits(), backend=cb.LocalBackend(2, hops="driver"), store=tmp_path / str(per_worker),
                                  seed=0, verbose=0))
    assert shelves[0].spilled > 12 and shelves[1].spilled == 0
    assert results[0].history().equals(results[1].history())
    for one, other in zip(results[0].trials, results[1].trials, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), other.state_dict().values()))


def test_a_spilled_state_changed_on_disk_is_refused_naming_the_file(tmp_path):
    shelf = StateShelf(resident=1, directory=str(tmp_path))
    kept = shelf.put(state(0))
    spilled = shelf.put(state(1))
    shelf.close()
    path = spilled._path
    with open(path, "r+b") as f:        # one flipped byte in the last tensor's data
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    from cerebro.store import StateFormatError
    with pytest.raises(StateFormatError, match=rf"^the driver's spilled state {re.escape(path)} changed on disk "
                                               rf"since it was written \(CRC-32 0x[0-9a-f]{{8}}, written "
                                               rf"0x[0-9a-f]{{8}}\)$"):
        spilled.get()
    assert same(kept.get(), state(0))
