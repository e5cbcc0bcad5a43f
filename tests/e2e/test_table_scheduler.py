"""`stepcli table --scheduler` with a bad address or something that is not a Dask scheduler: one line, exit 2,
quickly, no traceback (local listeners on 127.0.0.1 only)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_stepcli

CONNECT_TIMEOUT_S = 10.0  # as the README promises (stepcli.traces.cluster.CONNECT_TIMEOUT_S)

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
        b"HTTP/1.1 400 Bad Request\r\n\r\n",  # not Dask: it would size a buffer of 3.07 EiB from "HTTP/1.1"
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
