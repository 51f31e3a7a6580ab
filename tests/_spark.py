"""Spark sessions for the tests: local mode, and a real standalone cluster on 127.0.0.1."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable   # executors run this venv's Python

from pyspark import find_spark_home  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402


def session(master: str) -> SparkSession:
    spark = (SparkSession.builder.master(master).appName("cerebro-tests")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)   # polling a server that is starting; no test result depends on it
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")


@contextmanager
def standalone_cluster(workers: int, cores: int, log_dir: str) -> Iterator[str]:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1; yields the master URL."""
    spark_class = os.path.join(find_spark_home._find_spark_home(), "bin", "spark-class")
    env = {**os.environ, "SPARK_LOG_DIR": log_dir, "SPARK_WORKER_DIR": log_dir}
    port = _free_port()
    started = []
    try:
        master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(_free_port())], env=env,
                                  stdout=open(os.path.join(log_dir, "master.log"), "w"), stderr=subprocess.STDOUT)
        started.append(master)
        _wait_for_port(port, master, "the Spark master")
        for i in range(workers):
            worker_port = _free_port()
            worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker",
                                       f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--port", str(worker_port),
                                       "--webui-port", str(_free_port()), "--cores", str(cores), "--memory", "2g"],
                                      env=env, stdout=open(os.path.join(log_dir, f"worker{i}.log"), "w"),
                                      stderr=subprocess.STDOUT)
            started.append(worker)
            _wait_for_port(worker_port, worker, f"Spark worker {i}")
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in reversed(started):
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def blocked_python(tmp_path) -> str:
    """A Python whose ``import cerebro`` fails as where torch is missing."""
    blocked = tmp_path / "blocked" / "cerebro"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ncd {tmp_path}\nPYTHONPATH={blocked.parent} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python)
