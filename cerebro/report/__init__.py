from ._progress import ConsoleProgress, NoProgress, Progress
from ._result import Result, TrialResult, load

__all__ = ["ConsoleProgress", "NoProgress", "Progress", "Result", "TrialResult", "load"]
