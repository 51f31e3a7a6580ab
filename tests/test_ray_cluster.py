"""``RayBackend`` on a real Ray cluster: a head and a second node started with ``ray start``
on 127.0.0.1, reached by ``cerebro run --backend ray`` through ``RAY_ADDRESS``: the workers
run on both nodes and give the local backend's bits (issue 36)."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pandas as pd
import pytest
from _cli_runs import run_on

import cerebro as cb

pytest.importorskip("ray")
pytestmark = pytest.mark.slow



def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def ray_cluster(nodes: int = 2) -> Iterator[dict[str, str]]:
    """A Ray head and ``nodes - 1`` more nodes of one CPU each on 127.0.0.1; yields the
    environment a driver connects with. Token authentication is off for this private
    cluster alone (Ray turns it on where ``~/.ray/auth_token`` exists)."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    temporary = tempfile.mkdtemp(prefix="ray", dir="/tmp")       # short: Ray's socket paths have a limit
    port = _free_port()
    env = {**os.environ, "RAY_TMPDIR": temporary, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": f"127.0.0.1:{port}"}
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([ray, "start", "--head", f"--port={port}", "--include-dashboard=false", *common], env=env,
                       check=True, capture_output=True, timeout=180)
        for _ in range(nodes - 1):
            subprocess.run([ray, "start", f"--address=127.0.0.1:{port}", *common], env=env, check=True,
                           capture_output=True, timeout=180)
        yield env
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temporary, ignore_errors=True)


def test_cerebro_run_on_a_two_node_ray_cluster_gives_the_local_bits_with_a_worker_on_each_node(tmp_path):
    @contextlib.contextmanager
    def cluster() -> Iterator[dict[str, str]]:
        with ray_cluster(nodes=2) as env:
            yield env
            # The same from Python, the cluster named by RayBackend(address=...), not by RAY_ADDRESS.
            script = ("import runpy, cerebro as cb; names = runpy.run_path('experiment.py'); "
                      f"names['search'].fit(names['data'], backend=cb.RayBackend(2, address={env['RAY_ADDRESS']!r}), "
                      "store='by-address', seed=1, verbose=0)")
            env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
            ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=600)
            assert ran.returncode == 0, ran.stderr

    workers = run_on(tmp_path, "ray", cluster)
    nodes = {info["launched_by"].split(" on node ")[1] for info in workers.values()}
    assert len(nodes) == 2                   # SPREAD: one worker on each node
    pd.testing.assert_frame_equal(cb.load(tmp_path / "by-address").history(), cb.load(tmp_path / "local").history(),
                                  check_exact=True)
