"""`stepcli table --scheduler` with a bad address or something that is not a Dask scheduler: one
line, exit 2, quickly, no traceback (local listeners on 127.0.0.1 only)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_stepcli, stepcli_env

# as docs/concepts/culprit.md promises (stepcli.traces.cluster.CONNECT_TIMEOUT_S)
CONNECT_TIMEOUT_S = 10.0

pytest.importorskip("distributed")


def _assert_one_line(result: object, expected: str) -> None:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 2, stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr and "__del__" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert expected in lines[0], stderr


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, str]]:
    """A TCP socket listening on 127.0.0.1 and its tcp:// address."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock, f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def _serve(sock: socket.socket, answer: bytes) -> threading.Thread:
    """Answer every connection with `answer`, then keep it open until the other side closes it."""

    def loop() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            try:
                conn.sendall(answer)
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            finally:
                conn.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("garbage", "not a scheduler address"),
        ("tcp://127.0.0.1", "not a scheduler address"),
        ("tcp://127.0.0.1:99999", "port 99999"),
        ("tls://127.0.0.1:8786", "tls:// is not supported"),
        ("ucx://127.0.0.1:8786", "ucx:// is not supported"),
        ("tcp://a b:1", "not a scheduler address"),
    ],
)
def test_bad_addresses_are_refused_at_once(address: str, expected: str, rank_folder: Path) -> None:
    started = time.monotonic()
    result = run_stepcli("table", "--scheduler", address, rank_folder, timeout=120)
    _assert_one_line(result, expected)
    assert time.monotonic() - started < CONNECT_TIMEOUT_S  # no connection was tried


@pytest.mark.parametrize(
    "answer",
    [
        # not Dask: it would size a buffer of 3.07 EiB from "HTTP/1.1"
        b"HTTP/1.1 400 Bad Request\r\n\r\n",
        b"\xff" * 64,
        (100).to_bytes(8, "little") + b"\x07" * 100,  # a plausible length, then not a Dask message
        b"",  # accepts, then says nothing
    ],
    ids=["http", "garbage", "plausible-then-garbage", "silent"],
)
def test_something_that_is_not_a_scheduler_is_one_line_within_the_timeout(
    answer: bytes, listener: tuple[socket.socket, str], rank_folder: Path
) -> None:
    sock, address = listener
    _serve(sock, answer)
    started = time.monotonic()
    result = run_stepcli("table", "--scheduler", address, rank_folder, timeout=180)
    _assert_one_line(result, address)
    assert time.monotonic() - started < 2 * CONNECT_TIMEOUT_S + 15, result.stderr  # it took 87 s


def test_a_listener_that_never_accepts_is_one_line_within_the_timeout(
    listener: tuple[socket.socket, str], rank_folder: Path
) -> None:
    _, address = listener  # the kernel completes the TCP handshake; nobody ever reads
    started = time.monotonic()
    result = run_stepcli("table", "--scheduler", address, rank_folder, timeout=180)
    _assert_one_line(result, "no answer within")
    assert time.monotonic() - started < CONNECT_TIMEOUT_S + 15, result.stderr


# -- a scheduler that cannot get the work done (issue 47, defects 10-12): one line, never a wait for
# ever ----------
@pytest.fixture
def lone_scheduler() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A Dask scheduler (its own process, so a test can kill it) with no worker; its tcp://
    address."""
    dask = Path(sys.executable).parent / "dask"
    proc = subprocess.Popen(
        [str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"],
        env=stepcli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        address = ""
        for line in proc.stderr:  # "... Scheduler at:   tcp://127.0.0.1:PORT"
            if "Scheduler at:" in line:
                address = line.split("Scheduler at:", 1)[1].strip()
                break
        assert address.startswith("tcp://"), "the scheduler never said where it listens"
        # (its log must never fill the pipe)
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield proc, address
    finally:
        proc.kill()
        proc.wait()


def _table(address: str, folder: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stepcli", "table", "--scheduler", address, *extra, str(folder)],
        env=stepcli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _waiting(proc: subprocess.Popen[str]) -> str:
    """stepcli's first line: that it waits for a worker (a run that waits silently fails here,
    within a minute)."""
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stderr.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    if not lines:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("table --scheduler waited for a worker without a word")
    assert lines[0].startswith("stepcli: waiting for a worker of the Dask scheduler at "), lines[0]
    return lines[0]


def test_a_scheduler_without_a_worker_is_given_up_on_after_the_scheduler_wait(
    lone_scheduler: tuple[subprocess.Popen[str], str], rank_folder: Path
) -> None:
    # GIVEN a scheduler no worker ever joins WHEN `table --scheduler --scheduler-wait 2s` reads
    # through it
    _, address = lone_scheduler
    result = run_stepcli(
        "table", "--scheduler", address, "--scheduler-wait", "2s", rank_folder, timeout=120
    )
    # THEN it waits 2 s, saying so, then gives up in one line, exit 2
    assert result.returncode == 2, result.stderr
    waiting, error = result.stderr.strip().splitlines()
    assert waiting.startswith("stepcli: waiting for a worker") and "at most 2 s" in waiting
    assert error.startswith(f"stepcli: error: the Dask scheduler at {address} has no worker"), error
    assert "--scheduler-wait" in error


def test_workers_without_stepcli_are_one_line_not_a_wait_for_ever(
    lone_scheduler: tuple[subprocess.Popen[str], str], rank_folder: Path, tmp_path: Path
) -> None:
    # GIVEN a worker that cannot import stepcli (it dies on the first task it is given)
    _, address = lone_scheduler
    blocker = tmp_path / "blocked" / "stepcli"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('stepcli is not installed here')\n")
    worker = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dask"),
            "worker",
            address,
            "--nthreads",
            "1",
            "--no-dashboard",
        ],
        env=stepcli_env({"PYTHONPATH": str(blocker.parent)}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # WHEN table reads through that cluster
        result = run_stepcli(
            "table", "--scheduler", address, "--scheduler-wait", "3s", rank_folder, timeout=180
        )
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    # THEN one line says the work could not be run and why to look at the workers, exit 2
    assert result.returncode == 2, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"stepcli: error: the Dask scheduler at {address}"), result.stderr
    assert "is stepcli installed on them?" in error or "has no worker" in error, result.stderr
    assert "Traceback" not in result.stderr


def test_a_scheduler_gone_mid_read_is_one_line(
    lone_scheduler: tuple[subprocess.Popen[str], str], rank_folder: Path
) -> None:
    # GIVEN table's work submitted to a scheduler, waiting there for a worker
    scheduler, address = lone_scheduler
    proc = _table(address, rank_folder)
    _waiting(proc)
    # WHEN the scheduler goes away
    scheduler.kill()
    _, stderr = proc.communicate(timeout=120)
    # THEN one line says so, exit 2: no exit 70, no Dask log lines or asyncio tracebacks
    assert proc.returncode == 2, stderr
    (error,) = stderr.strip().splitlines()
    assert error.startswith(
        f"stepcli: error: lost the Dask scheduler at {address} while the traces were read"
    ), error


def test_ctrl_c_while_waiting_on_the_scheduler_is_aborted_and_nothing_else(
    lone_scheduler: tuple[subprocess.Popen[str], str], rank_folder: Path
) -> None:
    _, address = lone_scheduler
    proc = _table(address, rank_folder)
    _waiting(proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr == "stepcli: aborted\n"  # no "Task exception was never retrieved" block
