"""Tests of the state codec (cerebro/store/_state_codec.py) and the socket wire (cerebro/worker/_wire.py).

They prove that a trial's state (a torch model's and its Adam optimizer's state dicts, with
0-dim ``step`` tensors) and tensors of every common dtype, nested in dicts, lists and tuples,
survive pack -> write -> read -> unpack bitwise, through a file and over a real loopback TCP
connection in both directions (also with several threads sending at once); that both ends of
a connection must prove the auth key before a single message byte is read; and that a
closed peer or a truncated stream gives ``EOFError``. Invariants 2 and 3 of DESIGN.md rest on
this: a hop or a checkpoint must not change a single bit of a trial's state.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import io
import pickle
import queue
import socket
import struct
import threading
import warnings

import pytest
import torch

from cerebro.store import TensorBytes, frames, pack_tensors, read_message, unpack_tensors, write_message
from cerebro.store._legacy_pickle import read_pickled_state
from cerebro.worker._wire import Channel, HandshakeError, authenticate, connect

KEY = b"run-token-0123456789"
TIMEOUT = 10.0           # bounds every blocking call so a broken wire fails instead of hanging


def accept(server, authkey, timeout):
    """The driver's side: authenticate the next connection to ``server``."""
    return authenticate(server.accept()[0], authkey, timeout)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (so NaN payloads and -0.0 count too)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


def assert_same(got, expected):
    """``got`` has ``expected``'s structure (container types included) with bitwise-equal tensors."""
    assert type(got) is type(expected) or (isinstance(expected, dict) and type(got) is dict)
    if isinstance(expected, torch.Tensor):
        assert same_bits(got, expected), (got, expected)
        if not torch.isnan(expected).any():
            assert torch.equal(got, expected.detach())
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
    else:
        assert got == expected


def file_round_trip(message):
    buffer = io.BytesIO()
    write_message(buffer, pack_tensors(message))
    buffer.seek(0)
    got = unpack_tensors(read_message(buffer))
    assert buffer.read() == b""                      # the reader took exactly one message
    return got


def step_with_random_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step on seeded gradients (no autograd: its first use costs seconds)."""
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()


def trained_state(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step_with_random_gradients(model, optimizer)
    return model, optimizer, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def mixed_tensors() -> dict:
    floats = torch.tensor([1.5, -0.0, float("nan"), float("inf"), -float("inf"), 3e-40])
    return {
        "float32": floats,
        "float64": torch.randn(3, 4, dtype=torch.float64),
        "float16": floats.half(),
        "bfloat16": torch.randn(2, 3, 4).bfloat16(),
        "int64": torch.tensor([[-(2 ** 62), 0], [7, 2 ** 62]], dtype=torch.int64),
        "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "uint8": torch.arange(256, dtype=torch.uint8),
        "bool": torch.tensor([[True, False], [False, True]]),
        "complex64": torch.randn(3, dtype=torch.complex64),
        "scalar": torch.tensor(42, dtype=torch.int64),
        "empty": torch.zeros(0, 5),
        "transposed": torch.arange(12.0).reshape(3, 4).t(),          # not contiguous
        "needs_grad": torch.randn(4, requires_grad=True),
    }


# --------------------------------------------------------------------------------------------
# the codec, through a file
# --------------------------------------------------------------------------------------------

def test_model_and_adam_state_survive_a_file_round_trip_bitwise():
    model, optimizer, state = trained_state()
    got = file_round_trip(state)
    steps = [s["step"] for s in state["optimizer"]["state"].values()]
    assert steps and all(s.dim() == 0 for s in steps)              # 0-dim step tensors are in it
    assert_same(got, state)
    for key, tensor in state["model"].items():
        assert torch.equal(got["model"][key], tensor)
    for index, entry in state["optimizer"]["state"].items():
        for name, tensor in entry.items():
            assert torch.equal(got["optimizer"]["state"][index][name], tensor)
            assert got["optimizer"]["state"][index][name].shape == tensor.shape


def test_restored_state_continues_training_identically():
    model, optimizer, state = trained_state()
    restored_model, restored_optimizer, _ = trained_state(seed=99)       # other weights
    assert not torch.equal(restored_model[0].weight, model[0].weight)
    got = file_round_trip(state)
    restored_model.load_state_dict(got["model"])
    restored_optimizer.load_state_dict(got["optimizer"])
    for m, opt in ((model, optimizer), (restored_model, restored_optimizer)):
        torch.manual_seed(1)
        step_with_random_gradients(m, opt)
    for a, b in zip(model.state_dict().values(), restored_model.state_dict().values()):
        assert torch.equal(a, b)


def test_tensors_of_every_dtype_survive_bitwise():
    tensors = mixed_tensors()
    got = file_round_trip(tensors)
    assert_same(got, tensors)
    assert got["transposed"].shape == (4, 3)
    assert not got["needs_grad"].requires_grad


def test_nested_lists_tuples_and_plain_values_keep_their_types():
    a, b = torch.randn(2, 2, dtype=torch.float64), torch.tensor([True, False])
    message = {"nested": [a, (b, [torch.tensor(1.0, dtype=torch.bfloat16), "text"]), ()],
               "pair": (torch.arange(3), None), "config": {"lr": 0.1, "name": "mlp"},
               "count": 7, "raw": b"bytes"}
    got = file_round_trip(message)
    assert_same(got, message)
    assert type(got["nested"]) is list and type(got["nested"][1]) is tuple
    assert type(got["nested"][1][1]) is list and got["nested"][2] == ()


def test_pack_replaces_every_tensor_with_tensor_bytes():
    packed = pack_tensors({"a": [torch.ones(2), (torch.zeros(1),)], "b": 3})
    assert isinstance(packed["a"][0], TensorBytes) and isinstance(packed["a"][1][0], TensorBytes)
    assert packed["b"] == 3
    assert packed["a"][0].dtype == torch.float32 and packed["a"][0].shape == (2,)
    assert packed["a"][0].data.nbytes == 8


def test_unpacked_tensors_are_writable_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = file_round_trip({"w": torch.zeros(3)})
        got["w"].add_(1)                      # a read-only buffer would warn or fail here
    assert torch.equal(got["w"], torch.ones(3))


def test_several_messages_in_one_file_then_eof():
    first, second = mixed_tensors(), trained_state()[2]
    buffer = io.BytesIO()
    write_message(buffer, pack_tensors(first))
    write_message(buffer, pack_tensors(second))
    buffer.seek(0)
    assert_same(unpack_tensors(read_message(buffer)), first)
    assert_same(unpack_tensors(read_message(buffer)), second)
    with pytest.raises(EOFError):
        read_message(buffer)


def test_truncated_message_is_eof():
    buffer = io.BytesIO()
    write_message(buffer, pack_tensors({"x": torch.randn(100)}))
    data = buffer.getvalue()
    for cut in (5, len(data) // 2, len(data) - 1):
        with pytest.raises(EOFError):
            read_message(io.BytesIO(data[:cut]))


# --------------------------------------------------------------------------------------------
# the wire, over a real loopback socket
# --------------------------------------------------------------------------------------------

@pytest.fixture
def server():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT)
        yield listener


def in_thread(function, *args) -> tuple[threading.Thread, queue.Queue]:
    """Run ``function(*args)`` in a thread; its result or exception lands in the queue."""
    results: queue.Queue = queue.Queue()

    def target():
        try:
            results.put(("ok", function(*args)))
        except BaseException as error:          # noqa: BLE001 - handed to the test
            results.put(("error", error))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, results


def outcome(thread: threading.Thread, results: queue.Queue):
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "thread did not finish"
    return results.get_nowait()


def channel_pair(server: socket.socket) -> tuple[Channel, Channel]:
    thread, results = in_thread(accept, server, KEY, TIMEOUT)
    client = connect(server.getsockname(), KEY, timeout=TIMEOUT)
    status, driver = outcome(thread, results)
    assert status == "ok", driver
    return driver, client


def test_messages_round_trip_bitwise_in_both_directions(server):
    driver, worker = channel_pair(server)
    try:
        _, _, state = trained_state()
        big = {"weights": torch.randn(512, 1024), "note": "4 MiB, larger than a socket buffer"}
        for message in (state, mixed_tensors(), big):
            sender, results = in_thread(driver.send, pack_tensors(message))
            assert_same(unpack_tensors(worker.recv()), message)
            assert outcome(sender, results)[0] == "ok"
            sender, results = in_thread(worker.send, pack_tensors(message))
            assert_same(unpack_tensors(driver.recv()), message)
            assert outcome(sender, results)[0] == "ok"
    finally:
        driver.close()
        worker.close()


def test_concurrent_senders_never_interleave_messages(server):
    driver, worker = channel_pair(server)
    try:
        def send_many(thread_id: int):
            for i in range(25):
                worker.send(pack_tensors({"from": thread_id, "i": i,
                                          "t": torch.full((2000,), float(thread_id * 100 + i))}))

        senders = [in_thread(send_many, k) for k in range(4)]
        seen: dict[int, list[int]] = {k: [] for k in range(4)}
        for _ in range(100):
            message = unpack_tensors(driver.recv())
            assert torch.equal(message["t"], torch.full((2000,), float(message["from"] * 100 + message["i"])))
            seen[message["from"]].append(message["i"])
        for thread, results in senders:
            assert outcome(thread, results)[0] == "ok"
        assert seen == {k: list(range(25)) for k in range(4)}       # each thread's messages, in order
    finally:
        driver.close()
        worker.close()


def test_closed_peer_gives_eof_on_recv(server):
    driver, worker = channel_pair(server)
    worker.close()
    with pytest.raises(EOFError):
        driver.recv()
    driver.close()

    driver, worker = channel_pair(server)
    driver.close()
    with pytest.raises(EOFError):
        worker.recv()
    worker.close()


def test_peer_closing_mid_message_gives_eof(server):
    driver, worker = channel_pair(server)
    data = b"".join(bytes(frame) for frame in frames(pack_tensors({"x": torch.randn(1000)})))
    driver.sock.sendall(data[: len(data) // 2])
    driver.close()
    with pytest.raises(EOFError):
        worker.recv()
    worker.close()


# --------------------------------------------------------------------------------------------
# authentication: nothing is unpickled before both sides proved the key
# --------------------------------------------------------------------------------------------

UNPICKLED: list = []


def _record(value):
    UNPICKLED.append(value)
    return value


class Trap:
    """Unpickling this appends to UNPICKLED: proof that a message was unpickled."""

    def __reduce__(self):
        return _record, ("trap sprung" + "!" * 100,)


def trap_bytes() -> bytes:
    """A pickle framed as messages were before they became data only."""
    body = pickle.dumps(Trap(), protocol=5)
    return struct.pack("<QI", len(body), 0) + body


def test_trap_would_be_seen_if_unpickled():
    UNPICKLED.clear()
    read_pickled_state(trap_bytes())
    assert UNPICKLED and UNPICKLED.pop().startswith("trap sprung")


def test_client_with_wrong_key_is_refused(server):
    thread, results = in_thread(accept, server, KEY, TIMEOUT)
    with pytest.raises(HandshakeError, match=r"^the driver at 127\.0\.0\.1:\d+ refused this worker's token"):
        connect(server.getsockname(), b"wrong key", timeout=TIMEOUT)
    status, error = outcome(thread, results)
    assert status == "error" and isinstance(error, PermissionError)
    assert str(error) == "peer failed authentication"


def test_unauthenticated_client_sending_a_message_is_refused_unread(server):
    UNPICKLED.clear()
    thread, results = in_thread(accept, server, KEY, TIMEOUT)
    with socket.create_connection(server.getsockname(), timeout=TIMEOUT) as raw:
        nonce = b""
        while len(nonce) < 32:
            nonce += raw.recv(32 - len(nonce))
        raw.sendall(trap_bytes())                  # a message instead of the HMAC answer
        status, error = outcome(thread, results)
        assert status == "error" and isinstance(error, PermissionError)
        reply = b""
        try:
            while chunk := raw.recv(2):
                reply += chunk
        except ConnectionResetError:            # it hung up with our unread bytes pending
            pass
        assert reply in (b"", b"no")            # refused, never "ok", then hung up
    assert UNPICKLED == []


def test_worker_refuses_a_driver_that_cannot_prove_the_key(server):
    """A fake driver accepts any answer and then fails the worker's own challenge."""
    UNPICKLED.clear()
    worker_error: queue.Queue = queue.Queue()

    def fake_driver():
        sock, _ = server.accept()
        with sock:
            sock.settimeout(TIMEOUT)
            sock.sendall(b"\0" * 32)                                  # nonce
            answer = b""
            while len(answer) < 32:
                answer += sock.recv(32 - len(answer))
            sock.sendall(b"ok")                                       # accepts anything
            nonce = b""
            while len(nonce) < 32:
                nonce += sock.recv(32 - len(nonce))
            sock.sendall(hmac.new(b"not the key", nonce, hashlib.sha256).digest())
            sock.sendall(trap_bytes())
            worker_error.get(timeout=TIMEOUT)          # keep the socket open until the worker decided
        return answer

    thread, results = in_thread(fake_driver)
    try:
        with pytest.raises(HandshakeError, match=r"could not prove it holds the same one \(peer failed "
                                                 r"authentication\)$"):
            connect(server.getsockname(), KEY, timeout=TIMEOUT)
    finally:
        worker_error.put("done")
    status, answer = outcome(thread, results)
    assert status == "ok"
    assert answer == hmac.new(KEY, b"worker" + b"\0" * 32, hashlib.sha256).digest()   # the worker answered truly
    assert UNPICKLED == []


def test_worker_refuses_a_driver_that_sends_a_message_instead_of_a_challenge(server):
    UNPICKLED.clear()
    done: queue.Queue = queue.Queue()

    def fake_driver():
        sock, _ = server.accept()
        with sock:
            sock.sendall(trap_bytes())
            done.get(timeout=TIMEOUT)

    thread, results = in_thread(fake_driver)
    try:
        with pytest.raises(HandshakeError, match="refused this worker's token"):
            connect(server.getsockname(), KEY, timeout=TIMEOUT)
    finally:
        done.put("done")
    assert outcome(thread, results)[0] == "ok"
    assert UNPICKLED == []


def test_namedtuples_survive_packing():
    Pair = collections.namedtuple("Pair", "weight step")
    unpacked = unpack_tensors(pack_tensors(Pair(torch.arange(3.0), 2)))
    assert type(unpacked) is Pair and torch.equal(unpacked.weight, torch.arange(3.0)) and unpacked.step == 2


def test_connect_closes_its_socket_when_authentication_fails(server):
    import gc
    gc.collect()   # earlier tests' garbage must not warn inside the block below
    thread, results = in_thread(accept, server, KEY, TIMEOUT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(HandshakeError, match=r"\(the peer refused this side's proof of the token\)$"):
            connect(server.getsockname(), b"wrong key", timeout=TIMEOUT)
        gc.collect()
    assert outcome(thread, results)[0] == "error"
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
