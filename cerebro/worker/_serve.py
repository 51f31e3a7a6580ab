"""``python -m cerebro.worker._serve JOB_DIR INDEX``: a worker process of ``cb.predict``
(:mod:`cerebro.serve._local`). It builds the trial's model once (``build.pkl`` with
``job.json``'s config, ``weights.safetensors``), then reads ``START STOP`` lines on stdin:
for each it predicts those rows of ``rows.npy`` (``rows.arrow`` for bytes values), writes
``outputs-START.npy`` and answers ``START`` on stdout, until stdin ends. A process of its own,
started by path: a user's script that calls ``cb.predict`` is not imported again, as a
multiprocessing child would import it, and the driver's side (pandas, reports) is not
imported at all."""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def read_rows(job_dir: str) -> np.ndarray:
    """The rows :func:`write_rows` wrote, memory-mapped where they are numbers."""
    path = os.path.join(job_dir, "rows.npy")
    if os.path.exists(path):
        return np.load(path, mmap_mode="r", allow_pickle=False)
    import pyarrow as pa
    with pa.memory_map(os.path.join(job_dir, "rows.arrow")) as source:
        return np.array(pa.ipc.open_file(source).read_all().column(0).to_pylist(), dtype=object)


def write_rows(job_dir: str, features: np.ndarray) -> None:
    """``features`` for the workers: numbers as ``.npy``, bytes values as Arrow (no pickle)."""
    if features.dtype != object:
        np.save(os.path.join(job_dir, "rows.npy"), features, allow_pickle=False)
        return
    import pyarrow as pa
    table = pa.table({"features": pa.array(list(features), pa.binary())})
    with pa.OSFile(os.path.join(job_dir, "rows.arrow"), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def main(job_dir: str, index: int) -> None:
    import cloudpickle
    import torch
    from safetensors.torch import load_file

    from ._predict import inference_device, predict_rows

    with open(os.path.join(job_dir, "job.json")) as f:
        job = json.load(f)
    torch.set_num_threads(job["threads"])
    with open(os.path.join(job_dir, "build.pkl"), "rb") as f:
        build = cloudpickle.loads(f.read())      # the run's own build, which the caller trusts
    trainable = build(job["config"])
    trainable.load_weights(load_file(os.path.join(job_dir, "weights.safetensors")))
    rows = None
    for line in sys.stdin:
        start, stop = (int(v) for v in line.split())
        rows = read_rows(job_dir) if rows is None else rows      # written once the driver asks
        outputs = predict_rows(trainable, rows[start:stop], job["batch_size"], inference_device(index))
        np.save(os.path.join(job_dir, f"outputs-{start}.npy"), outputs, allow_pickle=False)
        print(start, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
