"""How much of a Cerebro run is overhead: worker utilization, hop latency, trainer speed.

Three measures, each against a target from DESIGN.md or the engine's own goals:

1. Worker utilization: 8 equal-cost trials on 2 local workers (a grid over a dummy key
   that does not change the model). From ``result.schedule()``: busy time (the sum of
   ``end - start`` over every sub-epoch) / (workers x (last end - first start)), i.e.
   after start-up. The same with each sub-epoch's compute time only shows the share spent
   moving state and waiting on the driver. Target >= 0.97 (DESIGN.md invariant 5). The
   same once more with trials of different sizes (sub-epochs ~5x apart in cost), reported
   beside it ("heterogeneous").
2. Hop latency: one ~1M-parameter trial (Linear(1000,1000)+ReLU+Linear(1000,10)) on 2
   workers with one-batch partitions, many epochs. Per train sub-epoch,
   hop = (end - start) - compute: driver -> worker transfer, load, pack, worker -> driver
   transfer. With Adam (~12 MB of model + optimizer state) and plain SGD (~4 MB).
   Target: median < 20 ms for the Adam state.
3. Trainer speed: a worker's training sub-epoch (batches in the sample order, made tensors, then
   ``cb.TorchTrainable.train_batches``) against a hand-written torch loop
   doing the same work on the same in-memory partition, alternated, medians.
   ratio = bare time / trainable time; target >= 0.95.

5. Keras 3 (where it is installed; ``KERAS_BACKEND`` picks the backend): the trainer speed of
   ``cb.KerasTrainable`` against a hand-written ``train_on_batch`` loop over the same batches
   (target >= 0.95; Keras's own ``model.fit`` over the same rows is shown beside it), and the
   hop latency of the same ~1M-parameter model with Adam (target: median < 25 ms).

An informational part ("hop_breakdown") times the pieces of a hop apart, so a slow
hop can be traced to its cause: pack, pickle, parse, load and checkpoint write of the Adam
state in-process, and round trips of both states to a second process over loopback TCP, as
raw bytes (the floor for moving a state both ways) and through Cerebro's own Channel.

    .venv/bin/python benchmarks/overhead.py            # full, ~1.5-3 min on 2 cores
    .venv/bin/python benchmarks/overhead.py --quick    # smoke run, < 40 s
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from _one_partition import order, partition, train

import cerebro as cb
from cerebro.engine import TrialRequest
from cerebro.store import frames, pack_tensors, parse, unpack_tensors

WORKERS = 2


# --- builds (module level, so cloudpickle ships them to the workers by value) --------------
def build_mlp(config: dict) -> cb.TorchTrainable:
    """A small MLP; ``config["trial"]`` is a dummy key that does not change the model."""
    model = torch.nn.Sequential(torch.nn.Linear(config["inputs"], config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                             torch.nn.functional.cross_entropy, batch_size=config["batch_size"])


def build_hop(config: dict) -> cb.TorchTrainable:
    """~1M parameters: Linear(1000,1000)+ReLU+Linear(1000,10); Adam (12 MB state) or SGD (4 MB)."""
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 10))
    if config["optimizer"] == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy,
                             batch_size=config["batch_size"])


def build_keras_hop(config: dict) -> Any:
    """build_hop in Keras 3: Dense(1000)+ReLU+Dense(10) on 1000 inputs, Adam."""
    import keras
    model = keras.Sequential([keras.Input((1000,)), keras.layers.Dense(1000, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return cb.KerasTrainable(model, batch_size=config["batch_size"])


# --- helpers --------------------------------------------------------------------------------
def _classification(rows: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    w = rng.standard_normal((features, 10), dtype=np.float32)
    return x, (x @ w).argmax(axis=1).astype(np.int64)


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _fit(search: cb.Searcher, data: cb.Dataset, hops: str = "direct") -> tuple[Any, float]:
    """Run ``search`` in a temporary store, deleted after; returns (schedule, wall seconds)."""
    root = tempfile.mkdtemp(prefix="cerebro-bench-")
    try:
        started = time.perf_counter()
        result = search.fit(data, backend=cb.LocalBackend(workers=WORKERS, threads_per_worker=1, hops=hops),
                            store=os.path.join(root, "run"), seed=0, verbose=0)
        wall = time.perf_counter() - started
        schedule = result.schedule()
        statuses = {t.trial_id: t.status for t in result.trials}
        if any(s != "completed" for s in statuses.values()):
            raise RuntimeError(f"benchmark trials did not all complete: {statuses}")
        return schedule, wall
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- 1. worker utilization ------------------------------------------------------------------
# Hidden sizes whose train sub-epochs differ about 5x in cost, for the heterogeneous grid.
HETEROGENEOUS_HIDDEN = [64, 96, 128, 160, 224, 288, 384, 512]


def utilization(quick: bool, heterogeneous: bool = False) -> dict[str, Any]:
    """8 trials on 2 workers: equal ones (a dummy key), or with hidden sizes that make
    their sub-epochs differ ~5x in cost."""
    settings = dict(trials=8, partitions=4, epochs=2 if quick else 3,
                    rows=8000 if quick else 30000, inputs=64, hidden=256, batch_size=32,
                    validation=0.2)
    x, y = _classification(settings["rows"], settings["inputs"], seed=1)
    data = cb.Dataset.from_numpy(x, y, validation=settings["validation"],
                                 partitions=settings["partitions"], seed=0)
    space = {"trial": cb.choice(list(range(settings["trials"]))), "inputs": settings["inputs"],
             "hidden": settings["hidden"], "batch_size": settings["batch_size"]}
    if heterogeneous:
        space["trial"], space["hidden"] = 0, cb.choice(HETEROGENEOUS_HIDDEN[:settings["trials"]])
    schedule, wall = _fit(cb.GridSearch(build_mlp, space, epochs=settings["epochs"]), data)
    schedule = schedule.sort_values("start").reset_index(drop=True)

    first, last = float(schedule["start"].min()), float(schedule["end"].max())
    span = last - first
    duration = schedule["end"] - schedule["start"]
    overhead = duration - schedule["compute"]
    # Each worker's first sub-epoch builds the first model there, and pays any first-use
    # cost (the first torch.optim optimizer imports torch._dynamo, seconds, which workers
    # now do at start-up). "Steady" leaves these out: from the last worker's first end.
    firsts = schedule.groupby("worker").head(1)
    steady_from = float(firsts["end"].max())
    steady_span = last - steady_from
    overlap = (np.minimum(schedule["end"], last)
               - np.maximum(schedule["start"], steady_from)).clip(lower=0)
    share = (overlap / duration).fillna(0.0)
    per_worker = {}
    for worker, rows in schedule.groupby("worker"):
        per_worker[int(worker)] = {
            "busy": float((rows["end"] - rows["start"]).sum()) / span,
            "idle_s": span - float((rows["end"] - rows["start"]).sum()),
            "compute": float(rows["compute"].sum()) / span,
            "sub_epochs": int(len(rows)),
            "first_sub_epoch_s": float(rows["end"].iloc[0] - rows["start"].iloc[0]),
            "first_sub_epoch_compute_s": float(rows["compute"].iloc[0])}
    later = ~schedule.index.isin(firsts.index)
    by_kind = {}
    for kind in ("train", "eval"):
        rows = schedule[(schedule["kind"] == kind) & later]
        d = rows["end"] - rows["start"]
        o = d - rows["compute"]
        by_kind[kind] = {
            "count": int(len(rows)),
            "median_duration_ms": 1e3 * float(d.median()),
            "median_compute_ms": 1e3 * float(rows["compute"].median()),
            "median_overhead_ms": 1e3 * float(o.median()),
            "p90_overhead_ms": 1e3 * float(o.quantile(0.9)),
            "total_overhead_s": float(o.sum())}
    # Time a worker sits idle between handing back one sub-epoch and getting the next; long
    # gaps (nothing runnable on that worker) are listed with the task that ended them.
    gaps, long_gaps = [], []
    for worker, rows in schedule.groupby("worker"):
        idle = rows["start"].to_numpy()[1:] - rows["end"].to_numpy()[:-1]
        gaps += list(idle)
        for i in np.flatnonzero(idle > 0.02):
            after = rows.iloc[i + 1]
            long_gaps.append({"worker": int(worker), "from_s": float(rows["end"].iloc[i]),
                              "seconds": float(idle[i]), "then": f"{after['trial_id']} {after['kind']} "
                              f"epoch {after['epoch']} partition {after['partition']}"})
    train = schedule[schedule["kind"] == "train"]
    per_trial = train.groupby("trial_id")["compute"].median()
    return {
        "settings": {**settings, "heterogeneous": heterogeneous},
        # slowest / fastest trial's median train sub-epoch compute time
        "cost_spread": float(per_trial.max() / per_trial.min()),
        "fit_wall_s": wall,
        # Start-up before the schedule's clock starts (meta build, partitions, worker
        # processes importing torch) plus teardown after it ends.
        "outside_schedule_s": wall - last,
        "span_s": span,
        "first_start_s": first,
        "sub_epochs": int(len(schedule)),
        "utilization": float(duration.sum()) / (WORKERS * span),
        "compute_utilization": float(schedule["compute"].sum()) / (WORKERS * span),
        "steady_from_s": steady_from,
        "steady_utilization": float(overlap.sum()) / (WORKERS * steady_span),
        "steady_compute_utilization": float((schedule["compute"] * share).sum()) / (WORKERS * steady_span),
        "busy_s": float(duration.sum()),
        "compute_s": float(schedule["compute"].sum()),
        "overhead_in_sub_epochs_s": float(overhead.sum()),
        "idle_s": WORKERS * span - float(duration.sum()),
        "median_gap_between_sub_epochs_ms": 1e3 * float(np.median(gaps)) if gaps else float("nan"),
        "idle_in_long_gaps_s": sum(g["seconds"] for g in long_gaps),
        "long_gaps": sorted(long_gaps, key=lambda g: g["from_s"]),
        "per_worker": per_worker,
        "by_kind_after_first": by_kind,
        "schedule": schedule.to_dict(orient="list"),
    }


# --- 2. hop latency -------------------------------------------------------------------------
class OneAtATime(cb.Searcher):
    """Trains ``configs`` one after the other, one live trial at a time.

    The hop runs for both optimizers then share one set of worker processes (start-up costs
    ~8 s on 2 cores), while each trial still runs alone, as in a 1-trial run.
    """

    def __init__(self, build, configs: list[dict], epochs: int) -> None:
        super().__init__(build, {"optimizer": cb.choice([c["optimizer"] for c in configs]),
                                 "batch_size": configs[0]["batch_size"]}, metric="train_loss")
        self.configs, self.epochs = configs, epochs

    def start(self, seed: int) -> None:
        self._queue, self._live = list(self.configs), False

    def suggest(self) -> list[TrialRequest]:
        if self._live or not self._queue:
            return []
        self._live = True
        return [TrialRequest(dict(self._queue.pop(0)), self.epochs)]

    def trial_ended(self, trial_id: str, status: str) -> None:
        self._live = False


def hop_latency(quick: bool, hops: str = "direct") -> dict[str, Any]:
    settings = dict(optimizers=["adam", "sgd"], partitions=2, batch_size=32,
                    epochs=10 if quick else 100, features=1000)
    # One batch per partition, no validation: each sub-epoch is one forward/backward/step.
    rows = settings["partitions"] * settings["batch_size"]
    x, y = _classification(rows, settings["features"], seed=2)
    data = cb.Dataset.from_numpy(x, y, validation=None, partitions=settings["partitions"], seed=0)
    configs = [{"optimizer": o, "batch_size": settings["batch_size"]} for o in settings["optimizers"]]
    schedule, wall = _fit(OneAtATime(build_hop, configs, settings["epochs"]), data, hops)
    schedule = schedule.sort_values("start").reset_index(drop=True)
    out: dict[str, Any] = {"settings": settings, "fit_wall_s": wall,
                           "outside_schedule_s": wall - float(schedule["end"].max())}
    for index, config in enumerate(configs):
        rows_ = schedule[(schedule["trial_id"] == f"t{index:04d}")].reset_index(drop=True)
        out[config["optimizer"]] = _hops(rows_, _state_bytes(build_hop(config)))
    return out


def _state_bytes(trainable: cb.TorchTrainable) -> int:
    return sum(t.numel() for t in _tensors(pack_tensors(_warm_state(trainable)), raw=True))


def _hops(schedule, state_bytes: int) -> dict[str, Any]:
    """Hop statistics of one trial's train sub-epochs, in start order."""
    hop = 1e3 * ((schedule["end"] - schedule["start"]) - schedule["compute"])
    # Did the previous sub-epoch of this trial run on the same worker? The state is sent
    # both ways either way; equal medians show that nothing is saved when it stays put.
    same = schedule["worker"].eq(schedule["worker"].shift())
    # The first epoch builds the model on each worker; leave it out of the steady state.
    steady = schedule["epoch"] > 1
    hops = list(hop[steady])
    # Driver time between a sub-epoch's end and the next one's start. After a trial's last
    # sub-epoch of an epoch the driver writes its checkpoint first, in its own loop.
    gaps = 1e3 * (schedule["start"].to_numpy()[1:] - schedule["end"].to_numpy()[:-1])
    after_end = schedule["epoch"].to_numpy()[1:] != schedule["epoch"].to_numpy()[:-1]
    return {
        "state_mb": state_bytes / 1e6,
        "samples": len(hops),
        "median_ms": statistics.median(hops),
        "p90_ms": _percentile(hops, 90),
        "mean_ms": statistics.fmean(hops),
        "min_ms": min(hops),
        "median_compute_ms": statistics.median(1e3 * schedule["compute"][steady]),
        "median_ms_same_worker_as_before": _median(hop[steady & same]),
        "median_ms_other_worker_than_before": _median(hop[steady & ~same]),
        "first_epoch_hops_ms": list(hop[~steady]),
        "median_gap_mid_epoch_ms": _median(gaps[~after_end]),
        "median_gap_after_epoch_end_ms": _median(gaps[after_end]),
        "hops_ms": hops,
        "compute_ms": list(1e3 * schedule["compute"][steady]),
        "gaps_ms": list(gaps),
        "gap_after_epoch_end": [bool(v) for v in after_end],
    }


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def _warm_state(trainable: cb.TorchTrainable) -> dict:
    """The trainable's state after one step, so the optimizer's moments exist."""
    x = torch.randn(trainable.batch_size, 1000)
    y = torch.randint(0, 10, (trainable.batch_size,))
    train(trainable, partition(x, y), seed=0)
    return trainable.state()


def _tensors(value: Any, raw: bool = False) -> list:
    from cerebro.store._state_codec import TensorBytes
    if isinstance(value, TensorBytes):
        return [torch.from_numpy(value.data)] if raw else [value.tensor()]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, raw)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, raw)]
    return []


# --- 4. where a hop's time goes --------------------------------------------------------------
# An echo peer in a second process: first raw bytes (8-byte length, then the bytes, echoed;
# length 0 ends that phase), then Cerebro's own Channel (messages echoed; None ends it).
_ECHO = r"""
import os, socket, struct, sys
from cerebro.worker._wire import connect
channel = connect((sys.argv[1], int(sys.argv[2])), bytes.fromhex(os.environ["BENCH_KEY"]))
sock, buffer = channel.sock, bytearray(1 << 25)
def read(view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError
        got += n
while True:
    header = bytearray(8)
    read(memoryview(header))
    size = struct.unpack("<Q", header)[0]
    if size == 0:
        break
    view = memoryview(buffer)[:size]
    read(view)
    sock.sendall(view)
while True:
    message = channel.recv()
    if message is None:
        break
    channel.send(message)
channel.close()
"""


def hop_breakdown(quick: bool) -> dict[str, Any]:
    """The pieces of a hop, timed apart (medians): in-process pack, pickle, unpack + load and
    checkpoint write of the Adam state; and round trips to a second process over loopback
    TCP, as raw bytes (the floor for moving a state both ways) and through Cerebro's Channel."""
    from cerebro.store import RunStore

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    repeats = 10 if quick else 30
    states = {}
    for optimizer in ("adam", "sgd"):
        trainable = build_hop({"optimizer": optimizer, "batch_size": 32})
        states[optimizer] = (trainable, _warm_state(trainable))
    sender, receiver = states["adam"][0], build_hop({"optimizer": "adam", "batch_size": 32})
    _warm_state(receiver)
    steps: dict[str, list[float]] = {k: [] for k in ("pack", "pickle_frames", "parse", "unpack_load",
                                                     "checkpoint_write")}
    root = tempfile.mkdtemp(prefix="cerebro-bench-")
    try:
        store = RunStore.create(os.path.join(root, "run"))
        for _ in range(repeats):
            t0 = time.perf_counter()
            packed = pack_tensors(sender.state())
            t1 = time.perf_counter()
            parts = frames(packed)
            t2 = time.perf_counter()
            blob = b"".join(bytes(part) for part in parts)       # not timed: the socket's job
            t3 = time.perf_counter()
            received = parse(_reader(blob))                      # copies into fresh buffers
            t4 = time.perf_counter()
            receiver.load_state(unpack_tensors(received))
            t5 = time.perf_counter()
            store.write_checkpoint("t0000", packed, 1)
            t6 = time.perf_counter()
            for name, value in zip(steps, (t1 - t0, t2 - t1, t4 - t3, t5 - t4, t6 - t5)):
                steps[name].append(1e3 * value)
        round_trips = _round_trips({name: pack_tensors(state) for name, (_, state) in states.items()},
                                   repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        torch.set_num_threads(previous_threads)
    medians = {f"{k}_ms": statistics.median(v) for k, v in steps.items()}
    return {"repeats": repeats, **medians, **{k: statistics.median(v) for k, v in round_trips.items()},
            "raw_ms": {**steps, **round_trips}}


def _reader(blob: bytes):
    view, position = memoryview(blob), [0]

    def read_into(target: memoryview) -> int:
        n = min(len(target), len(view) - position[0])
        target[:n] = view[position[0]:position[0] + n]
        position[0] += n
        return n
    return read_into


def _round_trips(packed: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Round trips of each state's bytes (raw) and of each packed state (Channel), in ms."""
    import struct
    import subprocess

    from cerebro.worker._wire import authenticate

    key = os.urandom(32)
    server = socket.create_server(("127.0.0.1", 0))
    host, port = server.getsockname()[:2]
    peer = subprocess.Popen([sys.executable, "-c", _ECHO, host, str(port)],
                            env={**os.environ, "BENCH_KEY": key.hex()}, stdin=subprocess.DEVNULL)
    out: dict[str, list[float]] = {}
    try:
        server.settimeout(120)
        channel = authenticate(server.accept()[0], key, timeout=120)
        sock = channel.sock
        for name, state in packed.items():
            raw = b"".join(bytes(part) for part in frames(state))
            back = bytearray(len(raw))
            times = out[f"tcp_raw_round_trip_{name}_ms"] = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                sock.sendall(struct.pack("<Q", len(raw)) + raw)
                view, got = memoryview(back), 0
                while got < len(raw):
                    got += sock.recv_into(view[got:])
                times.append(1e3 * (time.perf_counter() - t0))
        sock.sendall(struct.pack("<Q", 0))
        for name, state in packed.items():
            times = out[f"channel_round_trip_{name}_ms"] = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                channel.send(state)
                channel.recv()
                times.append(1e3 * (time.perf_counter() - t0))
        channel.send(None)
        channel.close()
        peer.wait(timeout=60)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
        server.close()
    return out


# --- 3. trainer speed -----------------------------------------------------------------------
def trainer_speed(quick: bool) -> dict[str, Any]:
    settings = dict(rows=8192, features=256, hidden=512, batch_size=64,
                    repetitions=7, torch_threads=1)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings["torch_threads"])
    try:
        x, y = _classification(settings["rows"], settings["features"], seed=3)
        features, label = torch.from_numpy(x), torch.from_numpy(y)

        def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(settings["features"], settings["hidden"]),
                                        torch.nn.ReLU(), torch.nn.Linear(settings["hidden"], 10))
            return model, torch.optim.Adam(model.parameters(), lr=1e-3)

        model, optimizer = make()
        trainable = cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy,
                                      batch_size=settings["batch_size"])
        bare_model, bare_optimizer = make()
        loss_fn, batch = torch.nn.functional.cross_entropy, settings["batch_size"]

        def bare(seed: int) -> float:
            rows_in_order = order(len(features), seed)
            bare_model.train()
            total = 0.0
            for start in range(0, len(features), batch):
                rows = rows_in_order[start:start + batch]
                inputs, targets = features[rows], label[rows]
                bare_optimizer.zero_grad(set_to_none=True)
                outputs = bare_model(inputs)
                loss = loss_fn(outputs, targets)
                loss.backward()
                bare_optimizer.step()
                total += loss.item() * len(targets)
            return total

        def timed(fn, seed: int) -> float:
            t0 = time.perf_counter()
            fn(seed)
            return time.perf_counter() - t0

        source = partition(features, label)
        run_trainable = lambda seed: train(trainable, source, seed)  # noqa: E731
        timed(bare, 0), timed(run_trainable, 0)                       # warm-up, not counted
        bare_s, trainable_s = [], []
        for rep in range(settings["repetitions"]):
            seed = rep + 1
            if rep % 2 == 0:                                          # alternate who goes first
                bare_s.append(timed(bare, seed))
                trainable_s.append(timed(run_trainable, seed))
            else:
                trainable_s.append(timed(run_trainable, seed))
                bare_s.append(timed(bare, seed))
        # Same seed, same init, same batches: the two loops must have trained identically.
        same = all(torch.equal(p, q) for p, q in zip(model.parameters(), bare_model.parameters()))
    finally:
        torch.set_num_threads(previous_threads)
    bare_median, trainable_median = statistics.median(bare_s), statistics.median(trainable_s)
    return {"settings": settings, "bare_s": bare_s, "trainable_s": trainable_s,
            "bare_median_s": bare_median, "trainable_median_s": trainable_median,
            "ratio": bare_median / trainable_median,
            # Less sensitive to a noisy machine: the median of each back-to-back pair's ratio.
            "pairwise_median_ratio": statistics.median(b / t for b, t in zip(bare_s, trainable_s)),
            "identical_weights": same}


# --- 5. Keras 3: trainer speed and hop latency ---------------------------------------------
def keras_trainer_speed(quick: bool) -> dict[str, Any]:
    """trainer_speed for ``cb.KerasTrainable``: its training sub-epoch against a hand-written
    ``train_on_batch`` loop over the same batches (the same work), alternated, medians; and,
    for reference, Keras's own ``model.fit`` over the rows in that order."""
    import keras
    settings = dict(rows=8192, features=256, hidden=512, batch_size=64, repetitions=3 if quick else 11,
                    keras_backend=keras.backend.backend())
    x, y = _classification(settings["rows"], settings["features"], seed=3)

    def make() -> Any:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((settings["features"],)),
                                  keras.layers.Dense(settings["hidden"], activation="relu"), keras.layers.Dense(10)])
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    trainable = cb.KerasTrainable(make(), batch_size=settings["batch_size"])
    bare_model, fit_model, batch = make(), make(), settings["batch_size"]

    def bare(seed: int) -> None:
        rows_in_order = order(len(y), seed).numpy()
        for start in range(0, len(y), batch):
            rows = rows_in_order[start:start + batch]
            bare_model.train_on_batch(x[rows], y[rows])

    def fit(seed: int) -> None:
        rows = order(len(y), seed).numpy()
        fit_model.fit(x[rows], y[rows], batch_size=batch, epochs=1, shuffle=False, verbose=0)

    source = partition(torch.from_numpy(x), torch.from_numpy(y))
    runs = {"bare": bare, "fit": fit, "trainable": lambda seed: train(trainable, source, seed)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():                                        # warm-up (tracing), not counted
        run(0)
    for rep in range(settings["repetitions"]):
        names = list(runs) if rep % 2 == 0 else list(reversed(runs))  # alternate who goes first
        for name in names:
            t0 = time.perf_counter()
            runs[name](rep + 1)
            times[name].append(time.perf_counter() - t0)
    # Same init, same batches: the trainer and the hand-written loop trained identically.
    same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(trainable.model.weights, bare_model.weights))
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"settings": settings, **{f"{name}_s": values for name, values in times.items()},
            **{f"{name}_median_s": value for name, value in medians.items()},
            "ratio": medians["bare"] / medians["trainable"],
            "pairwise_median_ratio": statistics.median(b / t for b, t in zip(times["bare"], times["trainable"])),
            "fit_ratio": medians["fit"] / medians["trainable"], "identical_weights": same}


def keras_hop_latency(quick: bool) -> dict[str, Any]:
    """hop_latency for a ~1M-parameter Keras model with Adam."""
    settings = dict(partitions=2, batch_size=32, epochs=10 if quick else 60, features=1000)
    rows = settings["partitions"] * settings["batch_size"]
    x, y = _classification(rows, settings["features"], seed=2)
    data = cb.Dataset.from_numpy(x, y, validation=None, partitions=settings["partitions"], seed=0)
    search = cb.GridSearch(build_keras_hop, {"batch_size": settings["batch_size"]}, epochs=settings["epochs"],
                           metric="train_loss")
    schedule, wall = _fit(search, data)
    schedule = schedule.sort_values("start").reset_index(drop=True)
    out = _hops(schedule, build_keras_hop({"batch_size": settings["batch_size"]}).nbytes())
    return {"settings": settings, "fit_wall_s": wall, "adam": out}


# --- the report -----------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "load_average_1m_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "torch": torch.__version__, "numpy": np.__version__, "cerebro": cb.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine()}


def table(rows: list[tuple[str, str, str, bool | None]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        width = max(len(r[0]) for r in rows)
        print(f"{'measure':<{width}}  {'value':>14}  {'target':>10}  met")
        for name, value, target, met in rows:
            print(f"{name:<{width}}  {value:>14}  {target:>10}  {'' if met is None else ('yes' if met else 'NO')}")
        return
    out = Table(title="Cerebro overhead")
    for column, justify in (("measure", "left"), ("value", "right"), ("target", "right"), ("met", "center")):
        out.add_column(column, justify=justify)
    for name, value, target, met in rows:
        out.add_row(name, value, target, "" if met is None else ("[green]yes" if met else "[red]NO"))
    console = Console()
    console.width = max(console.width, 100)
    console.print(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (< 40 s)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "overhead.json"),
                        help="where to write the JSON results (default: %(default)s)")
    parser.add_argument("--keras", action=argparse.BooleanOptionalAction, default=None,
                        help="measure the Keras trainer too, on KERAS_BACKEND's backend (default: where Keras is "
                             "installed)")
    args = parser.parse_args(argv)
    if args.keras is None:
        args.keras = importlib.util.find_spec("keras") is not None

    started = time.perf_counter()
    report: dict[str, Any] = {"command": shlex.join([sys.executable, *sys.argv]),
                              "quick": args.quick, "machine": machine(),
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    steps = [("trainer_speed", lambda: trainer_speed(args.quick)),
             ("hop_breakdown", lambda: hop_breakdown(args.quick)),
             ("utilization", lambda: utilization(args.quick)),
             ("heterogeneous", lambda: utilization(args.quick, heterogeneous=True)),
             ("hop", lambda: hop_latency(args.quick))]
    if args.keras:     # last: Keras loads its backend into this process
        # One thread per op in this process, as a worker with threads_per_worker=1 has.
        os.environ.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
                          XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        steps += [("keras_trainer_speed", lambda: keras_trainer_speed(args.quick)),
                  ("keras_hop", lambda: keras_hop_latency(args.quick))]
    for name, step in steps:
        t0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        report[name] = step()
        report[name]["seconds"] = time.perf_counter() - t0

    u, ts, hb = report["utilization"], report["trainer_speed"], report["hop_breakdown"]
    ha, hs = report["hop"]["adam"], report["hop"]["sgd"]
    he = report["heterogeneous"]
    targets = {"utilization": 0.97, "hop_adam_median_ms": 20.0, "trainer_ratio": 0.95,
               "keras_trainer_ratio": 0.95, "keras_hop_adam_median_ms": 25.0}
    report["targets"] = targets
    report["met"] = {"utilization": u["utilization"] >= targets["utilization"],
                     "hop_adam_median_ms": ha["median_ms"] < targets["hop_adam_median_ms"],
                     "trainer_ratio": ts["ratio"] >= targets["trainer_ratio"]}
    if args.keras:
        report["met"].update(
            keras_trainer_ratio=report["keras_trainer_speed"]["ratio"] >= targets["keras_trainer_ratio"],
            keras_hop_adam_median_ms=report["keras_hop"]["adam"]["median_ms"] < targets["keras_hop_adam_median_ms"])
    report["seconds"] = time.perf_counter() - started

    k = u["by_kind_after_first"]
    first = max(w["first_sub_epoch_s"] - w["first_sub_epoch_compute_s"] for w in u["per_worker"].values())
    rows = [
        (f"utilization, 8 trials on {WORKERS} workers", f"{u['utilization']:.3f}", ">= 0.97",
         report["met"]["utilization"]),
        (f"utilization, 8 trials costing up to {he['cost_spread']:.1f}x each other", f"{he['utilization']:.3f}", "",
         None),
        ("  steady (after each worker's 1st sub-epoch)", f"{he['steady_utilization']:.3f}", "", None),
        ("  compute only", f"{u['compute_utilization']:.3f}", "", None),
        ("  steady (after each worker's 1st sub-epoch)", f"{u['steady_utilization']:.3f}", "", None),
        ("  steady, compute only", f"{u['steady_compute_utilization']:.3f}", "", None),
        ("  1st sub-epoch per worker: non-compute s (max)", f"{first:.2f}", "", None),
        ("  train sub-epoch: compute / overhead ms (median)",
         f"{k['train']['median_compute_ms']:.0f} / {k['train']['median_overhead_ms']:.1f}", "", None),
        ("  eval sub-epoch: compute / overhead ms (median)",
         f"{k['eval']['median_compute_ms']:.1f} / {k['eval']['median_overhead_ms']:.1f}", "", None),
        ("  worker idle between sub-epochs ms (median)", f"{u['median_gap_between_sub_epochs_ms']:.1f}", "", None),
        ("  worker idle s: per worker / in gaps > 20 ms",
         " ".join(f"{w['idle_s']:.2f}" for w in u["per_worker"].values()) + f" / {u['idle_in_long_gaps_s']:.2f}",
         "", None),
        ("  fit() wall s: whole / outside the schedule (start-up)",
         f"{u['fit_wall_s']:.1f} / {u['outside_schedule_s']:.1f}", "", None),
        (f"hop latency, Adam {ha['state_mb']:.1f} MB, median ms", f"{ha['median_ms']:.1f}", "< 20",
         report["met"]["hop_adam_median_ms"]),
        (f"hop latency, Adam {ha['state_mb']:.1f} MB, p90 ms", f"{ha['p90_ms']:.1f}", "", None),
        (f"hop latency, SGD {hs['state_mb']:.1f} MB, median ms", f"{hs['median_ms']:.1f}", "", None),
        (f"hop latency, SGD {hs['state_mb']:.1f} MB, p90 ms", f"{hs['p90_ms']:.1f}", "", None),
        ("  Adam hop, same / other worker as before, ms",
         f"{ha['median_ms_same_worker_as_before']:.1f} / {ha['median_ms_other_worker_than_before']:.1f}", "", None),
        ("  driver gap mid-epoch / at epoch end, Adam, ms",
         f"{ha['median_gap_mid_epoch_ms']:.1f} / {ha['median_gap_after_epoch_end_ms']:.1f}", "", None),
        ("  loopback TCP round trip, raw bytes, Adam / SGD, ms",
         f"{hb['tcp_raw_round_trip_adam_ms']:.1f} / {hb['tcp_raw_round_trip_sgd_ms']:.1f}", "", None),
        ("  same through cerebro's Channel, Adam / SGD, ms",
         f"{hb['channel_round_trip_adam_ms']:.1f} / {hb['channel_round_trip_sgd_ms']:.1f}", "", None),
        ("  Adam state: pack / pickle / parse / load ms",
         f"{hb['pack_ms']:.1f} / {hb['pickle_frames_ms']:.1f} / {hb['parse_ms']:.1f} / "
         f"{hb['unpack_load_ms']:.1f}", "", None),
        ("  Adam state: checkpoint write ms", f"{hb['checkpoint_write_ms']:.1f}", "", None),
        ("trainer speed: bare / TorchTrainable time", f"{ts['ratio']:.3f}", ">= 0.95", report["met"]["trainer_ratio"]),
        ("  median of back-to-back pair ratios", f"{ts['pairwise_median_ratio']:.3f}", "", None),
        ("  median s: bare / TorchTrainable",
         f"{ts['bare_median_s']:.3f} / {ts['trainable_median_s']:.3f}", "", None),
    ]
    if args.keras:
        ks, kh = report["keras_trainer_speed"], report["keras_hop"]["adam"]
        backend = ks["settings"]["keras_backend"]
        rows += [
            (f"Keras ({backend}) trainer speed: train_on_batch loop / KerasTrainable time", f"{ks['ratio']:.3f}",
             ">= 0.95", report["met"]["keras_trainer_ratio"]),
            ("  median of back-to-back pair ratios", f"{ks['pairwise_median_ratio']:.3f}", "", None),
            ("  model.fit / KerasTrainable time", f"{ks['fit_ratio']:.3f}", "", None),
            ("  median s: loop / model.fit / KerasTrainable",
             f"{ks['bare_median_s']:.3f} / {ks['fit_median_s']:.3f} / {ks['trainable_median_s']:.3f}", "", None),
            (f"Keras ({backend}) hop latency, Adam {kh['state_mb']:.1f} MB, median ms", f"{kh['median_ms']:.1f}",
             "< 25", report["met"]["keras_hop_adam_median_ms"]),
            (f"Keras ({backend}) hop latency, Adam, p90 ms", f"{kh['p90_ms']:.1f}", "", None),
        ]
    table(rows)
    print(f"{'quick' if args.quick else 'full'} run in {report['seconds']:.0f} s on "
          f"{report['machine']['cpu_count']} CPUs, torch {torch.__version__}")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=float)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
