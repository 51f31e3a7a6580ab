"""A throwaway PostgreSQL server for the tests: ``initdb`` in a temporary directory, run by a
non-root OS user (``postgres`` when the tests run as root), listening only on a Unix socket
in that directory."""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from _apt import one_install_at_a_time


def server_binaries() -> str | None:
    """The directory of ``initdb`` and ``pg_ctl``, installing Debian's PostgreSQL 15 if it is
    missing and this is root on Debian; None where that cannot be done."""
    with one_install_at_a_time():
        found = _installed()
        if not found and os.geteuid() == 0 and shutil.which("apt-get"):
            subprocess.run(["apt-get", "install", "-y", "-q", "postgresql-15"], capture_output=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
            found = _installed()
    return os.path.dirname(found[-1]) if found else None


def _installed() -> list[str]:
    """Every installed version's initdb, the newest last."""
    paths = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    return sorted(paths, key=lambda p: [int(n) for n in p.split("/")[4].split(".") if n.isdigit()])


@contextlib.contextmanager
def postgres_server(binaries: str) -> Iterator[str]:
    """A running server; yields its URI (database ``postgres``, user ``tester``, a superuser,
    no password; a user named like the ``cerebro`` schema would put its tables in it)."""
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    directory = tempfile.mkdtemp(prefix="cerebro-pg-")
    if as_user:
        shutil.chown(directory, "postgres")
    data = os.path.join(directory, "data")

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")

    try:
        run(os.path.join(binaries, "initdb"), "-D", data, "-A", "trust", "-U", "tester", "--no-sync", "-E", "UTF8")
        run(os.path.join(binaries, "pg_ctl"), "-D", data, "-l", os.path.join(directory, "log"), "-w", "start", "-o",
            f"-k {directory} -c listen_addresses='' -c fsync=off -c full_page_writes=off")
        try:
            yield f"postgresql:///postgres?host={directory}&user=tester"
        finally:
            run(os.path.join(binaries, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def plpython_installed(binaries: str) -> bool:
    """Whether the server has PL/Python, installing Debian's package for its version if it is
    missing and this is root on Debian."""
    library = os.path.join(os.path.dirname(binaries), "lib", "plpython3.so")
    with one_install_at_a_time():
        if not os.path.exists(library) and os.geteuid() == 0 and shutil.which("apt-get"):
            version = os.path.basename(os.path.dirname(binaries))
            subprocess.run(["apt-get", "install", "-y", "-q", f"postgresql-plpython3-{version}"],
                           capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
    return os.path.exists(library)


def server_directory() -> str:
    """A new temporary directory the server's OS user may write (its run directories), in one
    parent removed as the test session ends (each full run had left some thirty run
    directories, owned by the server's user, in /tmp)."""
    global _SERVER_PARENT
    if _SERVER_PARENT is None:
        _SERVER_PARENT = _for_server(tempfile.mkdtemp(prefix="cerebro-sql-runs-"))
        atexit.register(shutil.rmtree, _SERVER_PARENT, ignore_errors=True)
    return _for_server(tempfile.mkdtemp(dir=_SERVER_PARENT))


_SERVER_PARENT: str | None = None


def _for_server(directory: str) -> str:
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres")
    return directory


def unreadable_by_server(paths: list[str]) -> list[str]:
    """Those of ``paths`` the server's OS user (``postgres`` when the tests run as root)
    cannot read."""
    if os.geteuid() != 0:
        return [p for p in paths if not os.access(p, os.R_OK | os.X_OK)]
    return [p for p in paths if subprocess.run(["runuser", "-u", "postgres", "--", "test", "-r", p, "-a", "-x", p],
                                               capture_output=True).returncode]
