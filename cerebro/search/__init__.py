from ._base import Searcher
from ._grid import GridSearch
from ._random import RandomSearch
from ._space import Distribution, choice, loguniform, quniform, randint, uniform

__all__ = ["Distribution", "GridSearch", "RandomSearch", "Searcher", "choice", "loguniform",
           "quniform", "randint", "uniform"]
