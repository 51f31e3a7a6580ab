"""Debian's chromium, headless, for the tests that render pages as a browser does."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from _apt import one_install_at_a_time

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=10000", "--window-size=1300,2600"]


def chromium_path() -> str:
    """Debian's chromium, installed by the test set-up where it is missing (never downloaded
    by a test tool); skips where it cannot be installed."""
    with one_install_at_a_time():
        for step in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                     ["apt-get", "install", "-y", "-q", "chromium"]):
            if shutil.which("chromium") is not None or shutil.which("apt-get") is None:
                break
            subprocess.run(step, capture_output=True, timeout=900)
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium package cannot be installed here")
    return shutil.which("chromium")
