from ._loop import run_worker
from ._protocol import Sums
from ._torch import TorchTrainable

__all__ = ["Sums", "TorchTrainable", "run_worker"]
