"""Start, wait for, and stop a local service process; pick free loopback ports."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGKILL, SIGTERM, Signals
from typing import IO, Self

LOOPBACK = "127.0.0.1"


def cache_dir(*parts: str) -> Path:
    """Return (and create) a cache directory outside the clone.

    ``LEASEWORKER_CACHE`` overrides the default ``$XDG_CACHE_HOME/leaseworker``
    (``~/.cache/leaseworker``), so CI and developers reuse downloads across clones.
    """
    root = os.environ.get("LEASEWORKER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "leaseworker"
    )
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port() -> int:
    """Return a TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int, *, timeout: float, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until something accepts TCP connections on ``port``.

    Raises ``RuntimeError`` early when ``process`` exits first, so a service that
    fails to start is reported at once instead of after the whole timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process {process.pid} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.2):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing answered on {LOOPBACK}:{port} within {timeout}s")
        time.sleep(0.05)


def run_captured(
    argv: list[str],
    *,
    cwd: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    user: int | None = None,
    group: int | None = None,
    extra_groups: list[int] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run a one-shot tool (initdb, Kafka's storage format, Maven) to completion.

    Output (stdout and stderr together) is captured for error messages; the
    return code is the caller's to check. ``user``/``group`` drop privileges.
    """
    return subprocess.run(
        argv,
        check=False,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        timeout=timeout,
        user=user,
        group=group,
        extra_groups=extra_groups,
    )


@dataclass
class LocalProcess:
    """A service process started by leaseworker, with its log file.

    ``stop()`` sends SIGTERM, waits, then SIGKILLs; it is safe to call twice.
    The process runs in its own session so a Ctrl-C in the parent's terminal
    does not kill it before the parent had a chance to stop it in order.
    """

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: list[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        user: int | None = None,
        group: int | None = None,
        extra_groups: list[int] | None = None,
    ) -> Self:
        """Start ``argv`` with stdout and stderr appended to ``log_path``.

        ``user``, ``group`` and ``extra_groups`` drop privileges in the child
        (servers such as PostgreSQL refuse to run as root).
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("ab")
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
        except BaseException:
            log.close()
            raise
        return cls(name=name, popen=popen, log_path=log_path, _log=log)

    @property
    def pid(self) -> int:
        """The operating-system process id."""
        return self.popen.pid

    def log_tail(self, lines: int = 30) -> str:
        """Return the last lines of the process log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, signum: Signals) -> None:
        """Send ``signum`` to the process unless it already exited."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def stop(self, timeout: float = 10.0, *, signals: tuple[Signals, ...] = (SIGTERM,)) -> None:
        """Stop the process by PID: each of ``signals`` in turn, then SIGKILL.

        Each signal gets ``timeout`` seconds to work. Safe to call twice.
        """
        for signum in signals:
            self.signal(signum)
            try:
                self.popen.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            self.signal(SIGKILL)
            self.popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
