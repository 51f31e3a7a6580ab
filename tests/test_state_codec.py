"""The data-only state codec (cerebro/store/_state_codec.py): invariant 3's "no file in a run
directory but build.pkl can run code when read", and the same for the worker protocol.

Every protocol message survives a round trip; crafted messages (a pickle, a type that is not
allowed, a tensor whose buffer does not fit its shape, limits) fail with StateFormatError
naming the problem and run nothing (a marker file their payload would write stays absent);
hypothesis fuzzes the decoder with random and mutated bytes and round-trips random trees; a
crafted checkpoint with a valid header and CRC-32 is reported as a problem naming its file;
a crafted message from an authenticated worker loses that worker, named, and runs nothing.
"""
from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import torch
from _crafted import craft_checkpoint, data_message, pickled_payload
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cerebro.store import STATE_FORMAT, RunStore, StateFormatError, TaskKind, frames, pack_tensors, read_message
from cerebro.worker import _protocol as protocol
from cerebro.worker._protocol import WIRE_TYPES


def encoded(message) -> bytes:
    return b"".join(bytes(frame) for frame in frames(message))


def decoded(data: bytes, types=WIRE_TYPES):
    return read_message(io.BytesIO(data), types)


# --- round trips ----------------------------------------------------------------------------

def test_every_protocol_message_survives_a_round_trip():
    state = pack_tensors({"model": {"w": torch.arange(6.0).reshape(2, 3)},
                          "optimizer": {"state": {0: {"step": torch.tensor(3.0)}},
                                        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0],
                                                          "foreach": None, "maximize": False}]}})
    sums = protocol.Sums(10, 2.5, {"accuracy": 7.0})
    messages = [
        protocol.Hello(1, 123, "host", "local process"),
        protocol.Setup([0, 2], "/runs/x/data", b"\x80\x05build", 2, 1.0),
        protocol.Ready(1, "cpu", {0: (100, 20), 2: (99, 21)}),
        protocol.SetupFailed(1, "Traceback ..."),
        protocol.RunSubEpoch(7, "t0003", {"lr": 0.01, "hidden": 16, "act": "relu"}, TaskKind.TRAIN, 2, 1,
                             11, 12, 3, state, retune=True, timeout=None),
        protocol.SubEpochDone(7, sums, 0.25, state, ("t0001",)),
        protocol.SubEpochDone(8, protocol.Sums(5, float("nan"), {}), 0.1),
        protocol.StateMissing(7), protocol.SubEpochFailed(7, "boom", timed_out=True),
        protocol.TakeOver([3]), protocol.Release([3]), protocol.Heartbeat(1), protocol.Shutdown(),
    ]
    for message in messages:
        got = decoded(encoded(message))
        assert type(got) is type(message)
        if isinstance(message, (protocol.RunSubEpoch, protocol.SubEpochDone)):
            assert encoded(got) == encoded(message)        # the same bytes again: nothing lost or changed
        elif isinstance(message, protocol.SubEpochDone):
            assert got.sums.rows == 5
        else:
            assert got == message
    task = decoded(encoded(messages[4]))
    assert task.kind is TaskKind.TRAIN and task.config == messages[4].config
    assert task.state["optimizer"]["state"][0]["step"].tensor().item() == 3.0
    assert task.state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)


def test_a_value_that_is_not_data_cannot_be_written():
    with pytest.raises(TypeError, match="^object cannot be written as data"):
        frames({"x": object()})


# --- crafted and damaged messages -----------------------------------------------------------

def crafted_messages(marker: str) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, the start of the StateFormatError's message)."""
    return {
        "a pickle": (pickled_payload(marker), "not a Cerebro data message: it starts with"),
        "a type it may not hold": (data_message({"$object": "system", "fields": {"command": f"touch {marker}"}}),
                                   "'system' is not a type this message may hold "
                                   "(allowed: ['Fetch', 'Forget', 'HandedBack', 'Heartbeat',"),
        "an enum that is not one": (data_message({"$enum": "Hello", "value": 1}),
                                    "'Hello' is not a type this message may hold (allowed: ['TaskKind'])"),
        "fields it lacks": (data_message({"$object": "Hello", "fields": {"worker": 1}}),
                            "Hello has the fields ['host', 'launched_by', 'pid', 'worker']; the message gives"),
        "fields it has not": (data_message({"$object": "Heartbeat", "fields": {"worker": 1, "exec": "x"}}),
                              "Heartbeat has the fields ['batches', 'task_id', 'total', 'worker']; the message gives "
                              "['exec', 'worker']"),
        "a dtype that is not one": (data_message({"$tensor": 0, "dtype": "load", "shape": [1]}, [b"x"]),
                                    "'load' is not a torch dtype"),
        "a buffer too short for the shape": (data_message({"$tensor": 0, "dtype": "float32", "shape": [2, 2]},
                                                          [b"\0" * 12]),
                                             "a float32 tensor of shape (2, 2) needs 16 bytes; its buffer has 12"),
        "a negative shape": (data_message({"$tensor": 0, "dtype": "float32", "shape": [-1]}, [b""]),
                             "tensor shape [-1] must be a list of non-negative integers"),
        "a missing buffer": (data_message({"$bytes": 3}), "buffer 3 does not exist: the message has 0"),
        "an unknown tag": (data_message({"$eval": "1+1"}), "malformed $eval entry"),
        "a malformed tag": (data_message({"$tuple": 5}), "malformed $tuple entry"),
        "a float that is not one": (data_message({"$float": "1e999999"}), "malformed $float entry"),
        "JSON that is not": (struct.pack("<4sQI", b"CBS1", 3, 0) + b"{x}", "its description is not JSON"),
        "nesting too deep": (data_message(json.loads("[" * 70 + "]" * 70)), "nested deeper than 64 levels"),
        "a huge description": (struct.pack("<4sQI", b"CBS1", 1 << 40, 0), "a description of 1099511627776 bytes"),
        "too many buffers": (struct.pack("<4sQI", b"CBS1", 2, 1 << 30), "a description of 2 bytes with 1073741824"),
    }


@pytest.mark.parametrize("name", list(crafted_messages("m")))
def test_a_crafted_message_fails_clearly_and_runs_nothing(tmp_path, name):
    marker = tmp_path / "ran"
    data, message = crafted_messages(str(marker))[name]
    with pytest.raises(StateFormatError) as caught:
        decoded(data)
    assert str(caught.value).startswith(message), str(caught.value)
    assert not marker.exists()


def test_the_marker_would_be_written_were_the_pickle_read(tmp_path):
    from cerebro.store._legacy_pickle import read_pickled_state
    read_pickled_state(pickled_payload(str(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


SAMPLE = encoded(pack_tensors({"model": {"w": torch.randn(3, 4), "b": torch.zeros(4)}, "step": (1, 2.5, None),
                               0: [b"raw", "text", True, float("inf")]}))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_never_do_more_than_fail(data):
    for candidate in (data, b"CBS1" + data):
        try:
            decoded(candidate)
        except (StateFormatError, EOFError):
            pass


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(1, 255)), min_size=1, max_size=4))
def test_mutated_messages_never_do_more_than_fail(flips):
    data = bytearray(SAMPLE)
    for offset, bits in flips:
        data[offset] ^= bits
    try:
        decoded(bytes(data))
    except (StateFormatError, EOFError):
        pass


plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False) | st.text()
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=5) | st.integers(-5, 5), children, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(plain)
def test_plain_data_survives_a_round_trip(value):
    assert decoded(encoded(value)) == value


# --- checkpoints ------------------------------------------------------------------------------

@pytest.mark.parametrize("craft", ["pickle as data", "pickle without a format", "a disallowed type"])
def test_a_crafted_checkpoint_is_a_problem_naming_its_file_and_runs_nothing(tmp_path, craft):
    store = RunStore.create(tmp_path / "run")
    store.write_run_info({"state_format": STATE_FORMAT, "seed": 0})
    store.write_checkpoint("t0000", pack_tensors({"w": torch.ones(2)}), epoch=1)
    store.write_checkpoint("t0000", pack_tensors({"w": torch.full((2,), 2.0)}), epoch=2)
    marker = tmp_path / "ran"
    latest = store.file("trials", "t0000", "checkpoint.state")
    body, header = {
        "pickle as data": (pickled_payload(str(marker)), {"format": STATE_FORMAT}),
        "pickle without a format": (pickled_payload(str(marker)), {}),
        "a disallowed type": (data_message({"$object": "system", "fields": {"command": f"touch {marker}"}}),
                              {"format": STATE_FORMAT}),
    }[craft]
    craft_checkpoint(latest, body, epoch=2, **header)
    found = RunStore.open(store.path).checkpoints("t0000")
    assert found[0]["path"] == latest and "state" not in found[0]
    assert found[0]["problem"].startswith({"pickle as data": "StateFormatError: not a Cerebro data message",
                                           "pickle without a format": "ValueError: its header names the format None",
                                           "a disallowed type": "StateFormatError: 'system' is not a type"}[craft])
    assert found[1]["epoch"] == 1 and torch.equal(found[1]["state"]["w"].tensor(), torch.ones(2))
    assert not marker.exists()


# --- a crafted hop payload from an authenticated worker ---------------------------------------

@pytest.mark.parametrize("payload", ["a pickle", "a type it may not hold"])
def test_a_crafted_message_from_a_worker_loses_that_worker_named_and_runs_nothing(tmp_path, payload):
    import socket
    from types import SimpleNamespace

    from cerebro.engine._pool import Lost, Worker, WorkerPool
    from cerebro.store import WorkerLost
    from cerebro.worker._wire import Channel

    marker = tmp_path / "ran"
    released, emitted = [], []
    pool = WorkerPool(SimpleNamespace(heartbeat_timeout=5.0, release=released.append), settings=None,
                      store=None, build_blob=b"", emit=emitted.append, now=lambda: 1.5)
    pool._starting = False
    with socket.create_server(("127.0.0.1", 0)) as server:
        worker_end = socket.create_connection(server.getsockname())
        driver_end = server.accept()[0]
    worker = pool.workers[3] = Worker(3, Channel(driver_end), 4242, "node7", [3], 0.0)
    worker_end.sendall(crafted_messages(str(marker))[payload][0])
    assert pool.receive(worker) is None
    [lost] = pool.events()
    assert isinstance(lost, Lost) and lost.worker is worker and 3 not in pool.workers and released == [3]
    assert lost.reason.startswith("sent a malformed message, which was not run: ")
    [event] = emitted
    assert isinstance(event, WorkerLost) and event.worker == 3 and event.reason == lost.reason
    assert not marker.exists()
    worker_end.close()


def test_a_message_in_memory_parses_without_copying_and_must_fill_it():
    from cerebro.store import parse_view
    message = {"w": pack_tensors(torch.arange(12, dtype=torch.float32).reshape(3, 4)), "step": 3}
    blob = bytearray(b"".join(bytes(f) for f in frames(message)))
    parsed = parse_view(memoryview(blob))
    assert parsed["step"] == 3 and torch.equal(parsed["w"].tensor(), torch.arange(12.0).reshape(3, 4))
    blob[-4:] = np.float32(99).tobytes()            # the tensor is a view of the bytes, not a copy
    assert parsed["w"].tensor()[2, 3] == 99
    with pytest.raises(StateFormatError, match="^3 bytes follow the message$"):
        parse_view(memoryview(blob + b"xyz"))
    with pytest.raises(EOFError, match=f"^the message needs more than the {len(blob) - 1} bytes there are$"):
        parse_view(memoryview(blob)[:-1])
