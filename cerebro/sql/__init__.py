"""The SQL front end: Cerebro inside PostgreSQL with MADlib's model-hopper API (see
``docs/sql.md``). :func:`install` creates the schema of PL/Python functions."""
from ._install import install

__all__ = ["install"]
