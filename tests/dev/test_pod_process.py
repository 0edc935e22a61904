"""The one pod process's life cycle, on stand-in processes and a stand-in ``/readyz``.

A pod is whatever its argv runs; here a few lines of Python instead of
``leaseworker run``, so exits, kills, restarts and readiness are exact.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from leaseworker_dev._services import PodProcess, free_port, until_ready

from ..waiting import eventually

SLEEPER = "import time; time.sleep(60)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ignoring SIGTERM', flush=True); time.sleep(60)"
)


def _pod(tmp_path: Path, code: str, health_port: int | None = None) -> PodProcess:
    return PodProcess(
        name="pod-x",
        argv=[sys.executable, "-c", code],
        env={},
        cwd=tmp_path,
        log=tmp_path / "pod-x.log",
        health_port=health_port,
    )


async def _logged(pod: PodProcess, text: str) -> bool:
    return text in pod.log_text()


@pytest.fixture
def pods() -> Iterator[list[PodProcess]]:
    """Pods a test starts; SIGKILLed at its end whatever happened."""
    started: list[PodProcess] = []
    yield started
    for pod in started:
        pod.kill()


async def test_a_kill_is_the_owners_exit_and_a_restart_runs_again(
    tmp_path: Path, pods: list[PodProcess]
) -> None:
    """``kill`` reaps and records (killed); ``exited`` does not report it; ``start`` again runs."""
    pod = _pod(tmp_path, SLEEPER).start()
    pods.append(pod)
    assert pod.running()
    assert pod.exited() is None
    assert pod.kill() == -signal.SIGKILL
    assert not pod.running()
    assert pod.exited() is None  # its owner ended it
    assert pod.process.returncode == -signal.SIGKILL  # the last process stays readable
    pod.start()
    assert pod.running()
    assert [(code, killed) for code, killed, _ in pod.exits] == [(-signal.SIGKILL, True)]


async def test_stop_escalates_to_sigkill_after_the_drain(
    tmp_path: Path, pods: list[PodProcess]
) -> None:
    """A pod that ignores SIGTERM is SIGKILLed once ``within`` has passed."""
    pod = _pod(tmp_path, STUBBORN).start()
    pods.append(pod)
    await eventually(lambda: _logged(pod, "ignoring SIGTERM"), within=30)
    assert await pod.stop(within=0.5) == -signal.SIGKILL
    assert [(code, killed) for code, killed, _ in pod.exits] == [(-signal.SIGKILL, False)]


async def test_an_exit_of_its_own_is_reported_once(tmp_path: Path, pods: list[PodProcess]) -> None:
    """A pod that ends by itself: ``exited`` gives its code once, then ``None``."""
    pod = _pod(tmp_path, "raise SystemExit(3)").start()
    pods.append(pod)
    assert await pod.wait_exit(within=30) == 3
    assert pod.exited() == 3
    assert pod.exited() is None
    assert [(code, killed) for code, killed, _ in pod.exits] == [(3, False)]


@pytest.fixture
def readyz() -> Iterator[tuple[int, dict[str, object]]]:
    """A stand-in ``/readyz`` on a loopback port; the test sets the answer it gives."""
    answer: dict[str, object] = {"code": 503, "body": {"status": "not_ready"}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(int(str(answer["code"])))
            self.end_headers()
            self.wfile.write(json.dumps(answer["body"]).encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], answer
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_readiness_is_what_readyz_answers(
    tmp_path: Path, readyz: tuple[int, dict[str, object]]
) -> None:
    """Not answering: ``None``; 503: not ready; 200: ready with its partitions."""
    assert _pod(tmp_path, SLEEPER, health_port=free_port()).readiness() is None
    port, answer = readyz
    pod = _pod(tmp_path, SLEEPER, health_port=port)
    assert pod.readiness() == {"status": "not_ready"}
    assert pod.assigned() == 0
    with pytest.raises(TimeoutError, match="pod-x not ready within 0s"):
        await until_ready([pod], within=0.3, partitions=False)
    answer.update(code=200, body={"status": "ready", "kafka": {"assigned_partitions": 2}})
    assert pod.assigned() == 2
    assert await until_ready([pod], within=10, partitions=True) < 10


async def test_last_words_are_the_latest_runs_error_line(
    tmp_path: Path, pods: list[PodProcess]
) -> None:
    """An exit of its own names its reason: the latest run's error line, not an earlier run's.

    The log is appended across restarts, and noise may follow the error line
    (the campaign prints it when it restarts a pod that exited by itself).
    """
    pod = _pod(tmp_path, "print('leaseworker run: error: the first run'); raise SystemExit(2)")
    pods.append(pod.start())
    assert await pod.wait_exit(within=30) == 2
    assert pod.last_words() == "leaseworker run: error: the first run"
    pod.argv = [
        sys.executable,
        "-c",
        "print('leaseworker run: error: the second run'); print('unclosed socket'); "
        "raise SystemExit(2)",
    ]
    pod.start()
    assert await pod.wait_exit(within=30) == 2
    assert pod.last_words() == "leaseworker run: error: the second run"
    pod.argv = [sys.executable, "-c", "print('no error here')"]
    pod.start()
    assert await pod.wait_exit(within=30) == 0
    assert pod.last_words() == "no error here"
