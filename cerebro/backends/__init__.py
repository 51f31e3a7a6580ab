from ._base import Backend, Hops
from ._dask import DaskBackend
from ._local import LocalBackend
from ._ray import RayBackend
from ._spark import SparkBackend

__all__ = ["Backend", "DaskBackend", "Hops", "LocalBackend", "RayBackend", "SparkBackend"]
