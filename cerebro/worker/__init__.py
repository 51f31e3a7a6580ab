from ._loop import run_worker
from ._torch import Sums, TorchTrainable

__all__ = ["Sums", "TorchTrainable", "run_worker"]
