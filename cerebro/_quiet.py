"""TensorFlow, quiet: its start-up banners and its retracing warnings stay out of a run's
terminal, in the driver and in every worker, whoever imports it (Keras, a user's script,
torch's TensorBoard writer, which imports TensorFlow where it is installed).

TensorFlow's C++ prints to fd 2 as it is imported, before any log level applies: absl's
INFO and WARNING lines (``I0000 ...``, ``W0000 ...``: oneDNN, the CPU's instructions), the
line before them and the CPU-feature line's continuation; those are dropped, errors (``E``)
and fatal lines (``F``) kept. Its Python logger then says errors only: a worker that builds
one model per trial makes Keras trace a new function for each, and TensorFlow would warn
"triggered tf.function retracing" every few trials. ``TF_CPP_MIN_LOG_LEVEL=0`` (TensorFlow's
own switch for its INFO lines) shows all of it.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

_BANNER = re.compile(r"(?:[IW]\d{4} |WARNING: All log messages before absl::InitializeLog\(\)|"
                     r"To enable the following instructions)")


def verbose() -> bool:
    """Whether the user asked TensorFlow for every line (``TF_CPP_MIN_LOG_LEVEL=0``)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0"


def quiet_tensorflow() -> None:
    """From now on in this process, TensorFlow is imported quietly and its logger says errors
    only (at once where it is imported already). Idempotent; nothing unless :func:`verbose`
    is False."""
    if verbose():
        return
    if "tensorflow" in sys.modules:
        _errors_only()
    elif not any(isinstance(finder, _QuietFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder())


def _errors_only() -> None:
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands TensorFlow's own spec on with a loader that runs its import
    with the banners dropped; then leaves ``sys.meta_path``."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow" or verbose():
            return None
        with contextlib.suppress(ValueError):      # another thread's import took it out already
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        assert spec is not None, "the import system sets a module's spec before exec_module"
        module.__loader__ = spec.loader = self.loader     # TensorFlow sees its own loader
        with start_up_banners_hidden():
            self.loader.exec_module(module)
        _errors_only()


@contextlib.contextmanager
def start_up_banners_hidden() -> Iterator[None]:
    """While the block runs, lines on fd 2 that are TensorFlow's start-up banners are dropped.
    fd 2 goes through a pipe meanwhile, whose other lines are passed on as they come, so an
    import that crashes the process still shows what it printed."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:          # no fd 2 to filter (a daemon's worker): nothing is shown anyway
        yield
        return
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def forward() -> None:
        with os.fdopen(read, "rb") as lines:
            for line in lines:
                if not _BANNER.match(line.decode(errors="replace")):
                    os.write(saved, line)
    thread = threading.Thread(target=forward, name="cerebro-quiet-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)          # the pipe's last write end closes: the thread reads to its end
        thread.join(timeout=5)
        if not thread.is_alive():
            os.close(saved)
