"""The ``cerebro`` command as where some of Cerebro's extras are not installed: a finder
first on ``sys.meta_path`` answers, for each package named, what Python answers for a
package that is not there (``ModuleNotFoundError: No module named ...``).

``python tests/_without.py onnx,onnxruntime export RUN -o model.onnx``
"""
from __future__ import annotations

import importlib.abc
import sys


class Absent(importlib.abc.MetaPathFinder):
    """Packages (by their top-level names) that this Python does not have."""

    def __init__(self, packages: set[str]) -> None:
        self.packages = packages

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.packages:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> None:
    packages = set(sys.argv[1].split(","))
    for name in [m for m in sys.modules if m.partition(".")[0] in packages]:
        del sys.modules[name]
    sys.meta_path.insert(0, Absent(packages))
    sys.argv = ["cerebro", *sys.argv[2:]]
    from cerebro.cli import entry
    entry()


if __name__ == "__main__":
    main()
