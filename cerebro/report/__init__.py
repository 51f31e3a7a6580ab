from ._html import write_report
from ._progress import ConsoleProgress, NoProgress, Progress
from ._result import NoBestTrialError, Result, load
from ._tensorboard import Fanout, TensorBoardLog
from ._trial_result import TrialResult, flat_config

__all__ = ["ConsoleProgress", "Fanout", "NoBestTrialError", "NoProgress", "Progress", "Result", "TensorBoardLog",
           "TrialResult", "flat_config", "load", "write_report"]
