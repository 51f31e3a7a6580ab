"""The fixed cost of a run: starting its workers, and stopping them at its end.

A search of one trial, one epoch, on 200 generated rows and 2 local workers, so nearly all
of its wall time is the run's own fixed cost: the workers' start (forked from the fork
server, or a Python process each importing torch), the work, and the wait for the workers to
exit at the end. Timed twice in one process: the first fit (imports, the fork server's
start) and the next (what every later run of a notebook, a test suite or a sweep pays). Each repeat
runs in a fresh process; ``--against DIR`` also runs the same script with the ``cerebro``
of another checkout (e.g. a ``git worktree`` of an older commit), alternating with this
one, so both are measured side by side under the same load.

    .venv/bin/python benchmarks/run_overhead.py [--repeats 7] [--against /tmp/old] \
        [--framework torch|keras] [--out benchmarks/results/run_overhead.json]

``--framework keras`` times the same search with a Keras model on TensorFlow, whose workers
import Keras (or are forked from a fork server that did).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ONE_RUN = r"""
import hashlib, json, sys, tempfile, time
import numpy as np, torch
import cerebro as cb
from cerebro.engine._pool import WorkerPool

def build(config):
    model = torch.nn.Linear(8, 2)
    return cb.TorchTrainable(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=config["lr"]),
                             loss=torch.nn.functional.cross_entropy, batch_size=32)

def keras_build(config):
    import keras
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(config["lr"]), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return cb.KerasTrainable(model, batch_size=32)

if sys.argv[1] == "keras":
    build = keras_build

marks = {}
opened, closed = WorkerPool.open, WorkerPool.close
def timed_open(self, *args, **kwargs):
    marks["start"] = time.perf_counter()
    try:
        return opened(self, *args, **kwargs)
    finally:
        marks["started"] = time.perf_counter()
def timed_close(self, *args, **kwargs):
    marks["stop"] = time.perf_counter()
    try:
        return closed(self, *args, **kwargs)
    finally:
        marks["stopped"] = time.perf_counter()
WorkerPool.open, WorkerPool.close = timed_open, timed_close

X = np.random.default_rng(0).normal(size=(200, 8)).astype("float32")
data = cb.Dataset.from_numpy(X, (X[:, 0] > 0).astype("int64"), validation=0.2, partitions=2, seed=0)
search = cb.GridSearch(build, {"lr": cb.choice([0.1])}, epochs=1)
first = time.perf_counter()
search.fit(data, workers=2, store=tempfile.mkdtemp(), seed=0, verbose=0)   # warm: imports, preflight
began = time.perf_counter()
result = search.fit(data, workers=2, store=tempfile.mkdtemp(), seed=0, verbose=0)
ended = time.perf_counter()
assert result.trials[0].status == "completed"
digest = hashlib.sha256(result.history().to_csv().encode())      # the run's results, to compare checkouts' bits
for name, tensor in sorted(result.trials[0].state_dict().items()):
    digest.update(name.encode() + tensor.numpy().tobytes())
print(json.dumps({"first_fit_s": began - first, "fit_s": ended - began, "start_s": marks["started"] - marks["start"],
                  "stop_s": marks["stopped"] - marks["stop"], "bits": digest.hexdigest()[:16]}))
"""


def one(root: str, framework: str) -> dict:
    env = {**os.environ, "PYTHONPATH": root, "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run([sys.executable, "-c", ONE_RUN, framework], env=env, capture_output=True, text=True,
                          timeout=300, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--against", help="another checkout's root, measured alternately with this one")
    parser.add_argument("--framework", choices=["torch", "keras"], default="torch",
                        help="the trial's model: torch, or Keras on TensorFlow")
    parser.add_argument("--out", default="benchmarks/results/run_overhead.json")
    args = parser.parse_args()
    roots = {"this": ROOT, **({"against": os.path.abspath(args.against)} if args.against else {})}
    samples: dict[str, list[dict]] = {name: [] for name in roots}
    for _ in range(args.repeats):
        for name, root in roots.items():
            samples[name].append(one(root, args.framework))
    medians = {name: {key: statistics.median(s[key] for s in runs) for key in runs[0] if key != "bits"}
               for name, runs in samples.items()}
    bits = {name: sorted({s["bits"] for s in runs}) for name, runs in samples.items()}
    print("| checkout | first fit s | next fit s | its workers' start s | their stop s | results' sha256 |\n"
          "|---|---|---|---|---|---|")
    for name, m in medians.items():
        print(f"| {name} ({roots[name]}) | {m['first_fit_s']:.2f} | {m['fit_s']:.2f} | {m['start_s']:.2f} "
              f"| {m['stop_s']:.2f} | {', '.join(bits[name])} |")
    if len({tuple(b) for b in bits.values()}) > 1:
        print("the checkouts' results differ")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable, *sys.argv]), "repeats": args.repeats, "roots": roots,
                   "framework": args.framework,
                   "medians": medians, "bits": bits, "samples": samples}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
