"""``python -m cerebro`` is the ``cerebro`` command."""
from .cli import main

main()
