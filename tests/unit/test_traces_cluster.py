"""stepcli.traces.cluster: which scheduler addresses are tried, and what counts as a Dask
scheduler's greeting."""

from __future__ import annotations

import pytest

from stepcli.errors import StepcliError
from stepcli.traces import cluster


def test_addresses_dask_accepts_are_parsed() -> None:
    assert cluster.parse_scheduler("tcp://10.0.0.5:8786") == ("10.0.0.5", 8786)
    assert cluster.parse_scheduler("node-1.cluster:8786") == ("node-1.cluster", 8786)
    assert cluster.parse_scheduler("tcp://[::1]:8786") == ("::1", 8786)
    assert cluster.CONNECT_TIMEOUT_S == 10.0  # docs/concepts/culprit.md's figure


@pytest.mark.parametrize(
    "address",
    [
        "garbage",
        "tcp://:8786",
        "tcp://h:0",
        "tcp://h:65536",
        "tls://h:1",
        "ucx://h:1",
        "tcp://h:1/x",
        "",
    ],
)
def test_other_addresses_are_refused(address: str) -> None:
    with pytest.raises(StepcliError):
        cluster.parse_scheduler(address)


def _framed(*frames: bytes) -> bytes:
    body = (
        len(frames).to_bytes(8, "little")
        + b"".join(len(f).to_bytes(8, "little") for f in frames)
        + b"".join(frames)
    )
    return body


def test_a_greeting_must_be_framed_as_dask_frames_it() -> None:
    greeting = _framed(b"\x81\xa1a\x01", b"xyz")
    assert cluster._is_framed(greeting, len(greeting))
    assert not cluster._is_framed(greeting, len(greeting) + 1)
    assert not cluster._is_framed(b"\x07" * 100, 100)
    assert not cluster._is_framed(b"", 0)


def test_files_go_to_the_cluster_in_runs_of_neighbours_in_order() -> None:
    from stepcli.traces.cluster import MIN_TASKS, TASKS_PER_THREAD, batched

    for count in (0, 1, 7, MIN_TASKS, MIN_TASKS + 1, 100, 1024):
        files = [f"rank{i}.json" for i in range(count)]
        for threads in (0, 1, 2, 64):
            batches = batched(files, threads)
            # every file once, in order; no empty task; as many tasks as threads x TASKS_PER_THREAD
            # (at least MIN_TASKS) allow, never more than the files; sizes at most one apart
            assert [f for batch in batches for f in batch] == files
            assert all(batches) and len(batches) == min(
                count, max(MIN_TASKS, TASKS_PER_THREAD * threads)
            )
            assert not batches or max(map(len, batches)) - min(map(len, batches)) <= 1
