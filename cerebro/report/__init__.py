from ._html import write_report
from ._progress import ConsoleProgress, NoProgress, Progress
from ._result import Result, TrialResult, flat_config, load
from ._tensorboard import Fanout, TensorBoardLog

__all__ = ["ConsoleProgress", "Fanout", "NoProgress", "Progress", "Result", "TensorBoardLog", "TrialResult",
           "flat_config", "load", "write_report"]
