from ._control import add_trial, stop
from ._driver import Driver
from ._errors import StoreWriteError, TooManyFailuresError, WorkerLostError
from ._execute import execute
from ._interface import Decision, Exploit, SearchPolicy, TrialRequest
from ._resume import ResumeError, resume
from ._scheduler import EVAL, TRAIN, MOPScheduler, Task, TaskKind
from ._seeds import init_seed, search_rng, subepoch_seed, trial_index, trial_name
from ._visit_order import VisitScheme, visit_order

__all__ = ["add_trial", "Decision", "Driver", "EVAL", "Exploit", "MOPScheduler", "ResumeError", "SearchPolicy",
           "StoreWriteError", "TRAIN", "Task", "TaskKind", "TooManyFailuresError", "TrialRequest", "WorkerLostError",
           "execute", "init_seed", "resume", "search_rng", "stop", "subepoch_seed", "trial_index", "trial_name",
           "VisitScheme", "visit_order"]
