"""Exports for serving a trial without Cerebro's run directory: ONNX (torch trials, checked
with onnxruntime before the file is written) and an MLflow pyfunc model
(:func:`cerebro.report._pyfunc.save_pyfunc`)."""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import torch

from ..data import FeatureSpec
from ..report import TrialResult
from ..worker import TorchTrainable

ONNX_TOLERANCE = 1e-4      # the largest difference from torch's outputs an export may show


def export_onnx(trial: TrialResult, path: str | os.PathLike, epoch: int | str = "best") -> None:
    """Write ``trial``'s torch module (the weights of ``epoch``) as ONNX with a dynamic batch
    axis. It takes what the module takes: the features after the ``eval_transform``. The
    export is run with onnxruntime on a batch of 3 rows against torch, and written only if
    they agree within :data:`ONNX_TOLERANCE`."""
    import onnxruntime

    trainable = trial.trainable(epoch)
    if not isinstance(trainable, TorchTrainable):
        raise ValueError(f"{trial.trial_id} is a {type(trainable).__name__} trial; ONNX export takes torch trials "
                         f"(save a Keras trial as model.keras)")
    spec = FeatureSpec.of_run(trial._require_result().store.read_run_info()["data"])
    rng = np.random.default_rng(0)
    rows = (rng.random((3, *spec.shape)) * 4).astype(spec.dtype) if spec.dtype != "bytes" else None
    if rows is None:
        raise ValueError("the run's features are encoded bytes; ONNX takes the decoded tensors: export the torch "
                         "module with cerebro export --torchscript instead")
    inputs = trainable.module_inputs(rows, rng)
    module = trainable.trained_model().cpu()
    with tempfile.TemporaryDirectory(prefix="cerebro-onnx-") as scratch:
        written = os.path.join(scratch, "model.onnx")
        torch.onnx.export(module, (inputs,), written, dynamo=True, input_names=["features"], output_names=["outputs"],
                          dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False, report=False,
                          external_data=False)     # one self-contained file (models under 2 GB)
        session = onnxruntime.InferenceSession(written, providers=["CPUExecutionProvider"])
        got = session.run(None, {"features": inputs.numpy()})[0]
        with torch.no_grad():
            expected = module(inputs).numpy()
        worst = float(np.abs(got - expected).max())
        if not worst <= ONNX_TOLERANCE:
            raise ValueError(f"the ONNX export of {trial.trial_id} differs from torch by {worst:.3g} on a batch "
                             f"(more than {ONNX_TOLERANCE}); nothing was written")
        shutil.copyfile(written, path)      # the scratch directory may be on another file system
