"""Exports for serving a trial without Cerebro's run directory: ONNX (torch trials, checked
with onnxruntime before the file is written), TorchScript (torch trials) and an MLflow pyfunc
model (:func:`cerebro.serve._pyfunc.save_pyfunc`)."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator

import numpy as np
import torch

from .._extras import require
from ..data import FeatureSpec
from ..results import TrialResult
from ..worker import TorchTrainable

ONNX_TOLERANCE = 1e-4      # the largest difference from torch's outputs an export may show
# What torch's ONNX exporter needs (torch.onnx imports them as it exports), and its check.
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


def check_onnx_installed() -> None:
    """Raise :class:`cerebro.MissingExtraError` unless the ``onnx`` extra is installed."""
    require("an ONNX export", *ONNX_PACKAGES)


def export_onnx(trial: TrialResult, path: str | os.PathLike, epoch: int | str = "best",
                verbose: bool = False) -> None:
    """Write ``trial``'s torch module (the weights of ``epoch``) as ONNX with a dynamic batch
    axis. It takes what the module takes: the features after the ``eval_transform``. The
    export is run with onnxruntime on a batch of 3 rows against torch, and written only if
    they agree within :data:`ONNX_TOLERANCE`. The exporter's own warnings (torchvision's
    operators it skips where torchvision is not installed, deprecations inside torch) are
    shown where ``verbose``."""
    check_onnx_installed()
    import onnxruntime

    trainable = _torch_trainable(trial, epoch, "ONNX export")
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
        with _exporter_quiet(not verbose):
            torch.onnx.export(module, (inputs,), written, dynamo=True, input_names=["features"],
                              output_names=["outputs"], dynamic_shapes=({0: torch.export.Dim("batch")},),
                              verbose=False, report=False, external_data=False)   # one file (models under 2 GB)
        session = onnxruntime.InferenceSession(written, providers=["CPUExecutionProvider"])
        got = session.run(None, {"features": inputs.numpy()})[0]
        with torch.no_grad():
            expected = module(inputs).numpy()
        worst = float(np.abs(got - expected).max())
        if not worst <= ONNX_TOLERANCE:
            raise ValueError(f"the ONNX export of {trial.trial_id} differs from torch by {worst:.3g} on a batch "
                             f"(more than {ONNX_TOLERANCE}); nothing was written")
        shutil.copyfile(written, path)      # the scratch directory may be on another file system


def export_torchscript(trial: TrialResult, path: str | os.PathLike, epoch: int | str = "best") -> None:
    """Write ``trial``'s torch module (the weights of ``epoch``) as TorchScript, which loads
    with ``torch.jit.load`` without Cerebro or the build code."""
    torch.jit.script(_torch_trainable(trial, epoch, "TorchScript export").trained_model().cpu()).save(path)


def _torch_trainable(trial: TrialResult, epoch: int | str, export: str) -> TorchTrainable:
    """``trial``'s trainable with the weights of ``epoch``; a Keras trial is refused in one line."""
    trainable = trial.trainable(epoch)
    if not isinstance(trainable, TorchTrainable):
        raise ValueError(f"{trial.trial_id} is a {type(trainable).__name__} trial; {export} takes torch trials "
                         f"(save a Keras trial as model.keras)")
    return trainable


@contextlib.contextmanager
def _exporter_quiet(quiet: bool) -> Iterator[None]:
    """Where ``quiet``: torch's ONNX exporter logs and warns nothing below an error."""
    if not quiet:
        yield
        return
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
