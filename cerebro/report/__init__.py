from ._html import write_report
from ._progress import ConsoleProgress, NoProgress, Progress
from ._result import Result, TrialResult, load
from ._tensorboard import Fanout, TensorBoardLog

__all__ = ["ConsoleProgress", "Fanout", "NoProgress", "Progress", "Result", "TensorBoardLog", "TrialResult", "load",
           "write_report"]
