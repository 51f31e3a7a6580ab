from ._driver import Driver, WorkerLostError
from ._execute import execute
from ._interface import Decision, SearchPolicy, TrialRequest
from ._scheduler import EVAL, TRAIN, MOPScheduler, Task
from ._seeds import init_seed, search_rng, subepoch_seed, visit_order

__all__ = ["Decision", "Driver", "EVAL", "MOPScheduler", "SearchPolicy", "TRAIN", "Task",
           "TrialRequest", "WorkerLostError", "execute", "init_seed", "search_rng",
           "subepoch_seed", "visit_order"]
