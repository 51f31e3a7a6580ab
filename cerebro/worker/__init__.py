from ._keras import KerasTrainable, driver_keras_backend
from ._loop import run_worker
from ._predict import inference_device, predict_rows
from ._protocol import Sums
from ._state_check import StateMismatchError
from ._torch import TorchTrainable
from ._trainable import Trainable, in_preflight, preflight

__all__ = ["KerasTrainable", "StateMismatchError", "Sums", "TorchTrainable", "Trainable", "driver_keras_backend",
           "in_preflight", "inference_device", "predict_rows", "preflight", "run_worker"]
