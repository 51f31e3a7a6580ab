import collections
import os
import time

import psutil
import pytest

# Tests start real workers on this machine; nothing may reach beyond loopback.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# Every process this test session starts inherits this mark, workers whose driver was killed
# too, so another session's workers on the same machine are never counted as ours. Each
# pytest-xdist worker is a session of its own: it inherits the controller's mark, so it adds
# its name, else one worker's test would count the other's live workers as left behind.
SESSION = os.environ.setdefault("CEREBRO_TEST_SESSION", str(os.getpid()))
if (_XDIST_WORKER := os.environ.get("PYTEST_XDIST_WORKER")) and not SESSION.endswith(f"-{_XDIST_WORKER}"):
    SESSION = os.environ["CEREBRO_TEST_SESSION"] = f"{SESSION}-{_XDIST_WORKER}"

def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``-n 2 --dist loadfile`` (pyproject's addopts) each test file runs whole on one
    xdist worker, so its module-scoped clusters and finished runs are made once. On an xdist
    worker the files with the most slow tests come first (``--no-loadscope-reorder`` keeps this
    order): the longest start first and the short ones fill in at the end, so neither worker
    finishes long before the other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
        items.sort(key=lambda item: -slow[item.path])        # stable: a file's tests keep their order


def _ours(process: psutil.Process) -> bool:
    try:
        return process.environ().get("CEREBRO_TEST_SESSION") == SESSION
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _live_workers() -> list[psutil.Process]:
    """This session's worker processes that still run: ``python -m cerebro.worker`` or forked
    by the local backend's fork server (named ``cerebro-worker``)."""
    found = []
    for process in psutil.process_iter(["cmdline", "name", "status"]):
        cmdline = process.info["cmdline"] or []
        worker = "cerebro.worker" in cmdline or process.info["name"] == "cerebro-worker"
        if worker and process.info["status"] != psutil.STATUS_ZOMBIE and _ours(process):
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
    from _sql import close_sessions, ready_database
    yield ready_database(postgres)
    close_sessions()
