from ._result import NoBestTrialError, Result, load
from ._trial_result import TrialResult, flat_config

__all__ = ["NoBestTrialError", "Result", "TrialResult", "flat_config", "load"]
