from ._asha import ASHA
from ._base import Searcher
from ._bohb import BOHB
from ._grid import GridSearch
from ._hyperband import Hyperband
from ._pbt import PBT
from ._random import RandomSearch
from ._space import Distribution, choice, loguniform, quniform, randint, uniform
from ._tpe import TPESearch

__all__ = ["ASHA", "BOHB", "PBT", "Distribution", "GridSearch", "Hyperband", "RandomSearch", "Searcher", "TPESearch",
           "choice", "loguniform", "quniform", "randint", "uniform"]
