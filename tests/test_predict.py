"""Inference with a trained trial: ``TrialResult.predict`` gives the model's own outputs
bitwise (torch and Keras), on numpy, pandas, Parquet and Dataset inputs, with the
evaluation's preprocessing (uint8 images through the ``eval_transform``), and reproduces the
recorded validation metric; ``cb.predict`` over 2 worker processes gives the same bits in
row order, keeps an id column, ranks the top-k classes; bad inputs are refused before any
batch runs, naming the expected and the given shape."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from _models import build, digit_images, image_build

import cerebro as cb

pytestmark = pytest.mark.slow


def digits_frame(rows: int = 600) -> pd.DataFrame:
    from sklearn.datasets import load_digits
    features, label = load_digits(return_X_y=True)
    frame = pd.DataFrame((features[:rows] / 16.0).astype(np.float32), columns=[f"p{i}" for i in range(64)])
    return frame.assign(digit=label[:rows])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[cb.Result, cb.Dataset, pd.DataFrame]:
    frame = digits_frame()
    data = cb.Dataset.from_pandas(frame, label="digit", partitions=2, seed=0)
    result = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-3])}, epochs=3, metric="val_accuracy",
                           mode="max").fit(data, workers=2, store=tmp_path_factory.mktemp("p") / "run", seed=0,
                                           verbose=0)
    return result, data, frame


def test_predict_gives_the_models_own_outputs_and_its_recorded_validation_metric(run):
    result, data, frame = run
    best = result.best
    features, label = data.validation_arrays()
    outputs = best.predict(features, batch_size=len(features))
    with torch.no_grad():
        expected = best.model()(torch.from_numpy(features)).numpy()
    assert np.array_equal(outputs, expected)
    accuracy = float((outputs.argmax(axis=1) == label).mean())
    assert accuracy == pytest.approx(best.best_metrics["val_accuracy"], abs=1e-6)
    last, model = best.predict(features, epoch="last", batch_size=7), best.model("last")
    with torch.no_grad():       # batch by batch: a matrix product's bits depend on the batch's size
        assert np.array_equal(last, np.concatenate([model(torch.from_numpy(features[i:i + 7])).numpy()
                                                    for i in range(0, len(features), 7)]))


def test_numpy_pandas_parquet_and_dataset_inputs_give_the_same_rows(run, tmp_path):
    result, data, frame = run
    best = result.best
    features = frame.drop(columns=["digit"]).to_numpy()
    expected = best.predict(features)
    shuffled = frame.drop(columns=["digit"]).iloc[:, ::-1].assign(id=np.arange(len(frame)))   # by name, not place
    assert np.array_equal(best.predict(shuffled), expected)
    shuffled.to_parquet(tmp_path / "rows.parquet")
    assert np.array_equal(best.predict(str(tmp_path / "rows.parquet")), expected)
    assert np.array_equal(best.predict(data), expected)


def test_bad_inputs_are_refused_naming_the_expected_and_given_shape(run):
    result, _, frame = run
    best = result.best
    with pytest.raises(ValueError, match=r"^the features have shape \(5, 32\), rows of \(32,\); the run trained "
                                         r"on rows of \(64,\)$"):
        best.predict(np.zeros((5, 32), np.float32))
    with pytest.raises(TypeError, match=r"^the features are uint8; the run trained on float32 features"):
        best.predict(np.zeros((5, 64), np.uint8))
    with pytest.raises(ValueError, match=r"^the DataFrame lacks the feature columns \['p63'\] the run trained on"):
        best.predict(frame.drop(columns=["p63"]))
    with pytest.raises(ValueError, match=r"^batch_size=0 must be a positive integer$"):
        best.predict(np.zeros((5, 64), np.float32), batch_size=0)
    with pytest.raises(ValueError, match=r"^trial='t0042' is not a trial of .*; its trials are \['t0000', 't0001'\]$"):
        cb.predict(result, np.zeros((5, 64), np.float32), trial="t0042")


@pytest.mark.parametrize("cpus, kind", [(2, "_Forked"), (4, "_Spawned")])
def test_batch_prediction_over_two_workers_is_predict_in_row_order_with_ids_and_top_k(run, tmp_path, monkeypatch,
                                                                                       cpus, kind):
    """One thread per worker: forked from this process; more: fresh processes. Either way
    the outputs are this process's bits with as many threads."""
    from cerebro.serve import _local
    result, _, frame = run
    rows = frame.drop(columns=["digit"]).assign(id=np.arange(len(frame)) * 10 + 7)
    threads = torch.get_num_threads()
    torch.set_num_threads(cpus // 2)            # as each of the 2 worker processes: the same bits
    try:
        expected = result.best.predict(rows)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    started = []

    def recording(name: str):
        made = getattr(_local, name)
        return lambda *args: started.append(name) or made(*args)

    for name in ("_Forked", "_Spawned"):
        monkeypatch.setattr(_local, name, recording(name))
    table = cb.predict(result.run_dir, rows, workers=2)
    assert started == [kind]
    assert list(table.columns) == ["id", *(f"output_{i}" for i in range(10))]
    assert np.array_equal(table["id"].to_numpy(), rows["id"].to_numpy())
    assert np.array_equal(table.drop(columns=["id"]).to_numpy(), expected)
    top = cb.predict(result, rows, workers=2, top_k=3)
    probabilities = torch.softmax(torch.from_numpy(expected.astype(np.float64)), dim=1).numpy()   # logits
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :3]
    assert np.array_equal(top[["class_1", "class_2", "class_3"]].to_numpy(), order)
    assert np.allclose(top[["prob_1", "prob_2", "prob_3"]].to_numpy(),
                       np.take_along_axis(probabilities, order, axis=1), rtol=0, atol=1e-12)
    assert (top["prob_1"] >= top["prob_2"]).all() and (top["prob_2"] >= top["prob_3"]).all()
    if kind == "_Spawned":
        return              # the CLI's processes take the machine's own CPU count
    rows.to_parquet(tmp_path / "in.parquet")
    done = subprocess.run([sys.executable, "-m", "cerebro", "predict", result.run_dir, str(tmp_path / "in.parquet"),
                           "-o", str(tmp_path / "out.parquet"), "--top-k", "3", "--workers", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "out.parquet"), top)


def test_uint8_images_go_through_the_eval_transform_not_the_training_one(tmp_path):
    images, label = digit_images(300)
    result = cb.GridSearch(image_build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
        cb.Dataset.from_numpy(images, label, partitions=2, seed=0), workers=2, store=tmp_path / "run", seed=0,
        verbose=0)
    outputs = result.best.predict(images, batch_size=len(images))
    with torch.no_grad():
        expected = result.best.model()(torch.from_numpy(images.astype(np.float32) / 255)).numpy()
    assert np.array_equal(outputs, expected)        # to_float alone: no flips, no noise


def test_a_keras_trial_predicts_its_models_outputs(tmp_path):
    keras = pytest.importorskip("keras")
    from _keras_models import build as keras_build
    frame = digits_frame(300)
    data = cb.Dataset.from_numpy(frame.drop(columns=["digit"]).to_numpy(), frame["digit"].to_numpy(), partitions=2,
                                 seed=0)
    result = cb.GridSearch(keras_build, {"architecture": cb.choice(["plain"])}, epochs=1).fit(
        data, workers=2, store=tmp_path / "run", seed=0, verbose=0)
    features = frame.drop(columns=["digit"]).to_numpy()
    outputs = result.best.predict(features, batch_size=64)
    expected = np.concatenate([np.asarray(result.best.model().predict_on_batch(features[i:i + 64]))
                               for i in range(0, len(features), 64)])
    assert keras.backend.backend() and np.array_equal(outputs, expected)


def test_chunks_start_at_batch_multiples_and_cover_every_row_once():
    from cerebro.serve._local import MIN_CHUNK_BATCHES, _chunks
    for rows, workers, batch in [(1, 2, 32), (600, 2, 32), (2_000_003, 2, 1024), (10_000, 7, 3)]:
        chunks = _chunks(rows, workers, batch)
        assert chunks[0][0] == 0 and chunks[-1][1] == rows
        assert all(stop == start for (_, stop), (start, _) in zip(chunks, chunks[1:]))
        assert all(start % batch == 0 and stop - start >= 1 for start, stop in chunks)
        assert all(stop - start >= MIN_CHUNK_BATCHES * batch for start, stop in chunks[:-1])


def test_a_worker_that_dies_gives_its_chunk_back_and_is_named(tmp_path, run):
    """The driver predicts what a dead worker process took, so the answer is whole; the
    warning names the worker and the last line it wrote (a started process) or its exit
    status (a forked one)."""
    import queue
    import signal
    import warnings

    from cerebro.serve._local import _feed, _Forked, _Spawned
    spawned = _Spawned(str(tmp_path), 1)
    spawned.process.kill()
    spawned.process.wait()
    (tmp_path / "stderr-1.txt").write_text("Traceback ...\nMemoryError: out of memory\n")
    forked = _Forked(2, run[0].best.trainable(), np.zeros((100, 64), np.float32), 32)
    os.kill(forked.process.pid, signal.SIGKILL)
    for worker, why in [(spawned, "MemoryError: out of memory"), (forked, "exit status -9")]:
        todo = queue.SimpleQueue()
        todo.put((0, 64))
        todo.put((64, 100))
        outputs = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _feed(worker, todo, outputs)
        worker.stop()
        assert outputs == {} and sorted([todo.get_nowait(), todo.get_nowait()]) == [(0, 64), (64, 100)]
        assert [str(w.message) for w in caught] == [
            f"prediction worker {worker.index} failed ({why}); the other workers predict its rows"]
