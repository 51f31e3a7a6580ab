from ._driver import Driver, WorkerLostError
from ._execute import execute
from ._interface import Decision, Exploit, SearchPolicy, TrialRequest
from ._resume import ResumeError, resume
from ._scheduler import EVAL, TRAIN, MOPScheduler, Task
from ._seeds import init_seed, search_rng, subepoch_seed, trial_index, visit_order

__all__ = ["Decision", "Driver", "EVAL", "Exploit", "MOPScheduler", "SearchPolicy", "TRAIN", "Task",
           "ResumeError", "TrialRequest", "WorkerLostError", "execute", "resume", "init_seed", "search_rng",
           "subepoch_seed", "trial_index", "visit_order"]
