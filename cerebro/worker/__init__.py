from ._keras import KerasTrainable, driver_keras_backend
from ._loop import run_worker
from ._protocol import Sums
from ._torch import TorchTrainable
from ._trainable import Trainable

__all__ = ["KerasTrainable", "Sums", "TorchTrainable", "Trainable", "driver_keras_backend", "run_worker"]
