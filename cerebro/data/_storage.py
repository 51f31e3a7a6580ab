"""How a worker holds its partitions: in memory or streamed, and where it caches remote ones."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ._cache import check_cache_dir


@dataclass(frozen=True)
class Storage:
    """A dataset's storage settings (see :class:`cerebro.Dataset`), as every worker gets them."""

    in_memory: bool | str = "auto"       # True, False or "auto"
    cache_dir: str | None = None         # None: a temporary directory

    @classmethod
    def checked(cls, in_memory: Any, cache_dir: Any) -> Storage:
        if not (isinstance(in_memory, bool) or in_memory == "auto"):
            raise ValueError(f"in_memory={in_memory!r} must be True (hold partitions in memory), False (stream "
                             f"them from disk) or 'auto' (decide from their size and the free memory)")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir={cache_dir!r} must be a local directory path or None (a temporary one)")
        if cache_dir is None:
            return cls(in_memory, None)
        path = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
        if os.path.lexists(path):       # here (a local backend's workers'), refused now; on a cluster, by each worker
            check_cache_dir(path)
        return cls(in_memory, path)
