"""``python -m cerebro`` is the ``cerebro`` command."""
from .cli import entry

entry()
