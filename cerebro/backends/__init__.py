from ._base import Backend
from ._local import LocalBackend
from ._spark import SparkBackend

__all__ = ["Backend", "LocalBackend", "SparkBackend"]
