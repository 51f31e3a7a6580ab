import os
import time

import psutil
import pytest

# Tests start real workers on this machine; nothing may reach beyond loopback.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# Every process this test session starts inherits this mark, workers whose driver was killed
# too, so another session's workers on the same machine are never counted as ours.
SESSION = os.environ.setdefault("CEREBRO_TEST_SESSION", str(os.getpid()))


def _ours(process: psutil.Process) -> bool:
    try:
        return process.environ().get("CEREBRO_TEST_SESSION") == SESSION
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _live_workers() -> list[psutil.Process]:
    """This session's local worker processes (``python -m cerebro.worker``) that still run."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if "cerebro.worker" in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE and _ours(process):
            found.append(process)
    return found


@pytest.fixture(autouse=True)
def no_worker_outlives_its_test():
    """After every test, no worker process of its runs is left alive (they may take a few
    seconds to notice that a killed driver is gone)."""
    before = {p.pid for p in _live_workers()}
    yield
    deadline = time.monotonic() + 15
    while (left := [p for p in _live_workers() if p.pid not in before]) and time.monotonic() < deadline:
        time.sleep(0.1)      # polling for the processes to end, with a deadline
    assert not left, f"worker processes left alive: {[(p.pid, p.info['cmdline']) for p in left]}"


@pytest.fixture(scope="session")
def postgres():
    """The URI of a throwaway PostgreSQL server (see ``_postgres.py``); the tests that use it
    are skipped, saying why, where PostgreSQL cannot be installed."""
    from _postgres import postgres_server, server_binaries

    binaries = server_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL's server is not installed and could not be (apt-get install postgresql-15)")
    with postgres_server(binaries) as uri:
        yield uri


@pytest.fixture(scope="session")
def database(postgres):
    """The throwaway server with Cerebro's SQL functions installed and the digits, two
    architectures and their model selection table in it (see ``_sql.py``)."""
    from _sql import ready_database
    return ready_database(postgres)
