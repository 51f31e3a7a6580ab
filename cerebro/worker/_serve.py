"""``python -m cerebro.worker._serve JOB_DIR INDEX``: one worker of ``cb.predict``. It builds
the trial's model once (``build.pkl`` with ``config.json``, ``weights.safetensors``),
predicts its share of the rows (``share-INDEX.npy``, or ``.arrow`` for bytes values) and
writes ``outputs-INDEX.npy``. A process of its own, started by path: a user's script that
calls ``cb.predict`` is not imported again, as a multiprocessing child would import it, and
the driver's side (pandas, reports) is not imported at all."""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def read_share(job_dir: str, index: int) -> np.ndarray:
    path = os.path.join(job_dir, f"share-{index}.npy")
    if os.path.exists(path):
        return np.load(path, mmap_mode="r", allow_pickle=False)
    import pyarrow as pa
    with pa.memory_map(os.path.join(job_dir, f"share-{index}.arrow")) as source:
        return np.array(pa.ipc.open_file(source).read_all().column(0).to_pylist(), dtype=object)


def write_share(job_dir: str, index: int, features: np.ndarray) -> None:
    if features.dtype != object:
        np.save(os.path.join(job_dir, f"share-{index}.npy"), features, allow_pickle=False)
        return
    import pyarrow as pa
    table = pa.table({"features": pa.array(list(features), pa.binary())})
    with pa.OSFile(os.path.join(job_dir, f"share-{index}.arrow"), "wb") as sink, \
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
    outputs = predict_rows(trainable, read_share(job_dir, index), job["batch_size"], inference_device(index))
    np.save(os.path.join(job_dir, f"outputs-{index}.npy"), outputs, allow_pickle=False)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
