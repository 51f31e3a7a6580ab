from ._base import Backend
from ._local import LocalBackend

__all__ = ["Backend", "LocalBackend"]
