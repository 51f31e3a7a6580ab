"""Untrusted ground, the smaller points (issue 50), each written as an attacker: a peer that
answers a state fetch with a well-formed state of the wrong shapes is blamed and the run goes
on bitwise as if undisturbed; a checkpoint with a valid header and CRC but odd content is
refused on load, export and predict, naming the file and what differs; predicting no rows
gives no rows of the right shape; a batch size that is no positive whole number is refused
up front."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys

import numpy as np
import pandas as pd
import psutil
import pytest
import torch
from _faults import claim
from _models import build, digits

import cerebro as cb
from cerebro.store import BEST, TrialStatus, pack_tensors, parse_view, unpack_tensors, write_state_file
from cerebro.worker import StateMismatchError
from cerebro.worker._loop import _Trainables
from cerebro.worker._outbox import Outbox
from cerebro.worker._peers import StateServer
from cerebro.worker._protocol import RunSubEpoch, StateMissing, TaskKind
from cerebro.worker._state_check import check_weights

KEY = b"k" * 32


# --- crafted states: each a well-formed state that is not the model's -----------------------
def _trained_state() -> dict:
    """The state of ``build``'s MLP (hidden 32) after one Adam step: moments included."""
    trainable = build({})
    trainable.model(torch.zeros(1, 64)).sum().backward()
    trainable.optimizer.step()
    return trainable.state()


def _crafted(how: str, state: dict) -> dict:
    model = dict(state["model"])
    if how == "shape":
        model["0.weight"] = torch.zeros(3, 3)
    elif how == "missing":
        del model["2.bias"]
    elif how == "dtype":
        model["0.weight"] = model["0.weight"].double()
    elif how == "not a tensor":
        model["0.weight"] = [1.0, 2.0]
    elif how == "unknown":
        model["9.weight"] = torch.zeros(2)
    elif how == "no model":
        return {"weights": model, "optimizer": state["optimizer"]}
    return {**state, "model": model}


PEER_STATES = {
    "shape": "weight '0.weight': expected a tensor of shape (32, 64) float32, got (3, 3) float32",
    "missing": "weight '2.bias' is missing: expected a tensor of shape (10,) float32",
    "dtype": "weight '0.weight': expected a tensor of shape (32, 64) float32, got (32, 64) float64",
    "not a tensor": "weight '0.weight': expected a tensor of shape (32, 64) float32, got a list, not a tensor",
    "unknown": "weight '9.weight' is not one of the model's 4 weights",
    "no model": "the state has no 'model' weights: expected a mapping with the key 'model', got "
                "['optimizer', 'weights']",
    "moment": "the optimizer state 'exp_avg' of parameter 0: expected a tensor of shape (32, 64), got (2,) float32",
}


def _task(fetch: tuple[str, int] | None = None, state: object = None) -> RunSubEpoch:
    return RunSubEpoch(7, "t0000", {}, TaskKind.TRAIN, 1, 0, 1, 2, 1, state, fetch=fetch)


@pytest.mark.parametrize("how", sorted(PEER_STATES))
def test_a_peer_answering_with_a_state_that_is_not_the_models_is_refused_not_loaded(how):
    state = _trained_state()
    if how == "moment":
        state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(2)
    crafted = pack_tensors(_crafted(how, state))
    outbox = Outbox(budget=1 << 20)
    outbox.put("t0000", 1, crafted)
    server = StateServer("127.0.0.1", KEY, outbox)
    try:
        trainables = _Trainables(build, torch.device("cpu"), 1 << 30, [100], KEY)
        answer = trainables.take(_task(fetch=server.address))
    finally:
        server.close()
    # The peer's fault, told to the driver as a state not to be had from it: not a failed trial.
    assert answer == StateMissing(7, refused=PEER_STATES[how])
    # The same state from the driver's own copy (a damaged checkpoint) fails the trial, saying why.
    with pytest.raises(StateMismatchError, match=f"^{re.escape(PEER_STATES[how])}$"):
        _Trainables(build, torch.device("cpu"), 1 << 30, [100], KEY).take(_task(state=crafted))


def test_a_state_without_an_entry_that_is_no_tensor_is_refused_naming_it():
    """A module's ``_extra_state`` has no tensor to describe; its absence was a TypeError."""
    expected = "weight '1._extra_state' is missing: expected an entry, of any value"
    with pytest.raises(StateMismatchError, match=f"^{re.escape(expected)}$"):
        check_weights({"0.weight": ((2, 2), "float32"), "1._extra_state": None}, {"0.weight": torch.zeros(2, 2)})


def test_the_models_own_state_from_a_peer_is_loaded_bitwise():
    state = _trained_state()
    outbox = Outbox(budget=1 << 20)
    outbox.put("t0000", 1, pack_tensors(state))
    server = StateServer("127.0.0.1", KEY, outbox)
    try:
        trainable = _Trainables(build, torch.device("cpu"), 1 << 30, [100], KEY).take(_task(fetch=server.address))
    finally:
        server.close()
    loaded = trainable.state()
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])


def lying_peer(marker: str):
    """``build``, except that in a worker process the first state any worker's outbox serves
    to a peer (once in the run: ``marker``) has its first weight replaced by a 3x3 tensor:
    well-formed, CRC and all, but not the model's."""
    def build_that_lies(config: dict) -> cb.TorchTrainable:
        if "cerebro.worker" in " ".join(psutil.Process().cmdline()) and not getattr(Outbox, "lies", False):
            honest = Outbox.get

            def get(self, trial_id, version, timeout=60.0):
                blob = honest(self, trial_id, version, timeout)
                if blob is None or not claim(marker, f"{trial_id} {version}"):
                    return blob
                state = unpack_tensors(parse_view(memoryview(bytearray(blob))))
                state["model"][next(iter(state["model"]))] = torch.zeros(3, 3)
                from cerebro.store import frames
                return b"".join(bytes(frame) for frame in frames(pack_tensors(state)))
            Outbox.get, Outbox.lies = get, True
        return build(config)
    return build_that_lies


def _journal(result: cb.Result) -> list[dict]:
    with open(os.path.join(result.run_dir, "journal.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_peer_sending_wrong_shapes_is_blamed_and_the_run_ends_bitwise_as_undisturbed(tmp_path, caplog):
    space = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}
    expected = cb.GridSearch(build, space, epochs=2).fit(digits(partitions=4), backend=cb.LocalBackend(2), seed=4,
                                                         verbose=0, store=tmp_path / "expected")
    marker = tmp_path / "lied"
    with caplog.at_level("WARNING", logger="cerebro"):
        result = cb.GridSearch(lying_peer(str(marker)), space, epochs=2).fit(
            digits(partitions=4), backend=cb.LocalBackend(2), seed=4, verbose=0, store=tmp_path / "run")
    trial_id, version = marker.read_text().split()
    assert [t.status for t in result.trials] == [TrialStatus.COMPLETED] * 4
    pd.testing.assert_frame_equal(result.history(), expected.history(), check_exact=True)
    for got, want in zip(result.trials, expected.trials):
        for epoch in ("best", "last"):
            assert all(torch.equal(v, want.state_dict(epoch)[k]) for k, v in got.state_dict(epoch).items())
    blame = (rf"worker \d \(pid \d+ on .+\) sent {trial_id}'s state {version}, which is not its model's: weight "
             rf"'0\.weight': expected a tensor of shape \((16|32), 64\) float32, got \(3, 3\) float32")
    warnings = [r.getMessage() for r in caplog.records if "refused a state" in r.getMessage()]
    assert len(warnings) == 1 and re.fullmatch(
        rf"worker \d \(pid \d+ on .+\) refused a state: {blame}\. Every hop goes through the driver from now on; "
        rf"that state is taken from elsewhere or recomputed from the last checkpoint", warnings[0])
    # The refused state's trial went back to its last checkpoint, the peer named as the cause.
    lost = [e["reason"] for e in _journal(result) if e["event"] == "state_lost" and e["trial_id"] == trial_id]
    assert any(re.fullmatch(rf"worker \d \(pid \d+ on .+\) could not fetch it: {blame}", r) for r in lost)
    assert not any(e["event"] in ("worker_lost", "trial_ended") and e.get("status") == "failed"
                   for e in _journal(result))


# --- checkpoints with odd content, and predictions -------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> cb.Result:
    """One small finished run (one trial, one epoch), copied by each test that changes it."""
    return cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
        digits(partitions=2), workers=1, seed=0, verbose=0, store=tmp_path_factory.mktemp("untrusted") / "run")


def _with_checkpoint(finished: cb.Result, tmp_path, how: str) -> tuple[cb.Result, str]:
    """A copy of ``finished`` whose best checkpoint holds a crafted state, written by the
    store's own writer: its header and CRC-32 are valid."""
    run = shutil.copytree(finished.run_dir, tmp_path / "run")
    path = os.path.join(run, "trials", "t0000", BEST)
    header = cb.load(run).store.checkpoints("t0000", (BEST,))[0]
    write_state_file(path, "t0000", header["epoch"], pack_tensors(_crafted(how, unpack_tensors(header["state"]))))
    return cb.load(run), path


LOADED = {
    "shape": "does not fit t0000's model as build(config) makes it: weight '0.weight': expected a tensor of "
             "shape (32, 64) float32, got (3, 3) float32",
    "missing": "does not fit t0000's model as build(config) makes it: weight '2.bias' is missing: expected a "
               "tensor of shape (10,) float32",
    "dtype": "does not fit t0000's model as build(config) makes it: weight '0.weight': expected a tensor of "
             "shape (32, 64) float32, got (32, 64) float64",
    "unknown": "does not fit t0000's model as build(config) makes it: weight '9.weight' is not one of the "
               "model's 4 weights",
    "not a tensor": "does not hold t0000's weights: weight '0.weight': expected a tensor, got a list, not a tensor",
    "no model": "does not hold t0000's weights: the state has no 'model' weights: expected a mapping with the key "
                "'model', got ['optimizer', 'weights']",
}


def _run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    from cerebro.cli import entry
    monkeypatch.setattr(sys, "argv", ["cerebro", *args])
    with pytest.raises(SystemExit) as exited:
        entry()
    return exited.value.code, capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(LOADED))
def test_a_checkpoint_with_odd_content_is_refused_naming_the_file_and_what_differs(
        finished, tmp_path, monkeypatch, capsys, how):
    result, path = _with_checkpoint(finished, tmp_path, how)
    message = f"the checkpoint {path} {LOADED[how]}"
    for load in (result.best.model, lambda: result.best.predict(np.zeros((2, 64), np.float32)),
                 lambda: cb.predict(result, np.zeros((2, 64), np.float32))):
        with pytest.raises(StateMismatchError, match=f"^{re.escape(message)}$"):
            load()
    out = str(tmp_path / "model.safetensors")
    code, err = _run_cli(monkeypatch, capsys, "export", result.run_dir, "-o", out)
    assert (code, err) == (2, f"error: {message}\n") and not os.path.exists(out)
    if "hold" in LOADED[how]:       # seen without the model: the raw weights are refused too
        with pytest.raises(StateMismatchError, match=f"^{re.escape(message)}$"):
            result.best.state_dict()


@pytest.mark.slow
def test_an_onnx_export_of_a_checkpoint_of_other_shapes_exits_2_writing_nothing(finished, tmp_path, monkeypatch,
                                                                                capsys):
    result, path = _with_checkpoint(finished, tmp_path, "shape")
    out = str(tmp_path / "model.onnx")
    code, err = _run_cli(monkeypatch, capsys, "export", result.run_dir, "-o", out)
    assert (code, err) == (2, f"error: the checkpoint {path} {LOADED['shape']}\n") and not os.path.exists(out)


@pytest.mark.slow
def test_predicting_no_rows_gives_no_rows_of_the_right_shape(finished):
    rows = np.zeros((0, 64), np.float32)
    outputs = finished.best.predict(rows)
    assert outputs.shape == (0, 10) and outputs.dtype == np.float32
    table = cb.predict(finished, rows)
    assert list(table.columns) == [f"output_{i}" for i in range(10)] and len(table) == 0
    frame = pd.DataFrame(rows, columns=[f"c{i}" for i in range(64)]).assign(id=np.arange(0))
    ranked = cb.predict(finished, frame, top_k=2)
    assert list(ranked.columns) == ["id", "class_1", "prob_1", "class_2", "prob_2"] and len(ranked) == 0


@pytest.mark.slow
@pytest.mark.parametrize("size", [0, -3, True, 2.5, "8"])
def test_predict_refuses_a_batch_size_that_is_no_positive_whole_number_before_any_work(finished, size):
    message = f"^batch_size={re.escape(repr(size))} must be a positive integer$"
    with pytest.raises(ValueError, match=message):
        finished.best.predict(np.zeros((3, 64), np.float32), batch_size=size)
    with pytest.raises(ValueError, match=message):
        cb.predict(finished, np.zeros((3, 64), np.float32), batch_size=size)


# --- trainers -------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, -1, True, 2.5, None])
def test_a_trainer_refuses_a_batch_size_that_is_no_positive_whole_number(size):
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=f"^batch_size={re.escape(repr(size))} must be a positive integer$"):
        cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), 0.1), torch.nn.functional.cross_entropy,
                          batch_size=size)
    assert cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), 0.1), torch.nn.functional.cross_entropy,
                             batch_size=np.int64(8)).batch_size == 8      # a numpy integer is a whole number


@pytest.mark.slow       # imports Keras and its backend
def test_a_keras_trainer_refuses_batch_size_0():
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"^batch_size=0 must be a positive integer$"):
        cb.KerasTrainable(model, batch_size=0)
