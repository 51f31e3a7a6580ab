from ._loop import run_worker
from ._torch import Sums, TorchTrainable, state_from_bytes, state_to_bytes

__all__ = ["TorchTrainable", "Sums", "run_worker", "state_from_bytes", "state_to_bytes"]
