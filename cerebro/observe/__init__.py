from ._progress import ConsoleProgress, NoProgress, Progress
from ._tensorboard import Fanout, TensorBoardLog

__all__ = ["ConsoleProgress", "Fanout", "NoProgress", "Progress", "TensorBoardLog"]
