from ._run_store import RunStore

__all__ = ["RunStore"]
