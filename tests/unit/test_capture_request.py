"""What a running process accepts from `stepcli capture`: the request check and the control files'
reads."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stepcli.agent import controlfiles
from stepcli.agent.request import (
    MAX_ACTIVE,
    MAX_WARMUP,
    Invalid,
    check_ping,
    check_request,
    request_id,
)

GOOD = {"id": "a1b2", "open_at": 10, "first_step": 11, "last_step": 13}


def test_a_well_formed_request_passes() -> None:
    assert check_request(dict(GOOD, host="h", pid=3, created_at=1.0)) == ("a1b2", 10, 11, 13)
    assert check_request(dict(GOOD, open_at=11, last_step=11)) == ("a1b2", 11, 11, 11)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"id": ["x"]}, "its id is not a string"),
        ({"id": ""}, "its id is not a string"),
        ({"id": "x" * 65}, "its id is not a string"),
        ({"id": "a\x1b[2Jb"}, "its id is not a string"),
        ({"first_step": 9}, "it needs open_at <= first_step <= last_step"),
        ({"last_step": 10}, "it needs open_at <= first_step <= last_step"),
        ({"first_step": "11"}, "whole numbers"),
        ({"first_step": 11.0}, "whole numbers"),
        ({"open_at": True}, "whole numbers"),
        ({"open_at": -1}, "whole numbers"),
        ({"last_step": 2**63}, "whole numbers"),
        ({"first_step": 10 + MAX_WARMUP + 1, "last_step": 10 + MAX_WARMUP + 1}, "warmup is longer"),
        ({"last_step": 11 + MAX_ACTIVE}, f"records more than {MAX_ACTIVE} steps"),
    ],
)
def test_a_malformed_request_is_invalid_and_says_which_field(
    change: dict[str, object], why: str
) -> None:
    with pytest.raises(Invalid, match=why) as caught:
        check_request(dict(GOOD, **change))
    assert "\x1b" not in str(caught.value)  # never quotes the forged value


def test_a_bad_request_is_answered_under_its_id_only_when_the_id_is_usable() -> None:
    assert request_id(dict(GOOD, first_step=99)) == "a1b2"
    assert request_id(dict(GOOD, id=["x"])) is None and request_id([1]) is None
    with pytest.raises(Invalid, match="not a JSON object"):
        check_request(["a", 1, 2, 3])


def test_pings_are_checked_and_their_lease_clamped() -> None:
    assert check_ping({"id": "p1"}, 10.0, 1.0, 600.0) == ("p1", 10.0)
    assert check_ping({"id": "p1", "lease_s": 1e300}, 10.0, 1.0, 600.0) == ("p1", 600.0)
    assert check_ping({"id": "p1", "lease_s": 0}, 10.0, 1.0, 600.0) == ("p1", 1.0)
    for bad in ({"id": 5}, {"id": "p", "lease_s": "9"}, {"id": "p", "lease_s": float("nan")}, "p"):
        with pytest.raises(Invalid):
            check_ping(bad, 10.0, 1.0, 600.0)


@pytest.fixture
def folder(tmp_path: Path) -> int:
    path = tmp_path / "control"
    path.mkdir(mode=0o700)
    fd = controlfiles.open_folder(str(path))
    yield fd
    os.close(fd)


def test_a_regular_file_is_read_up_to_the_bound(tmp_path: Path, folder: int) -> None:
    (tmp_path / "control" / "requests.json").write_text('{"a": 1}')
    assert controlfiles.read_json(folder, "requests.json", 100) == {"a": 1}
    (tmp_path / "control" / "requests.json").write_text(" " * 101)
    with pytest.raises(controlfiles.Refused, match="larger than 100 bytes"):
        controlfiles.read_json(folder, "requests.json", 100)
    with pytest.raises(FileNotFoundError):
        controlfiles.read_json(folder, "absent.json", 100)


def test_a_link_a_fifo_and_a_device_are_refused_without_blocking(
    tmp_path: Path, folder: int
) -> None:
    path = tmp_path / "control" / "requests.json"
    path.symlink_to("/dev/zero")
    with pytest.raises(controlfiles.Refused, match="is a link"):
        controlfiles.read_json(folder, "requests.json", 100)
    path.unlink()
    os.mkfifo(path)  # nobody writes to it: a blocking open would wait forever
    start = time.monotonic()
    with pytest.raises(controlfiles.Refused, match="not a regular file"):
        controlfiles.read_json(folder, "requests.json", 100)
    assert time.monotonic() - start < 5


def test_deeply_nested_json_is_malformed_not_a_crash(tmp_path: Path, folder: int) -> None:
    (tmp_path / "control" / "requests.json").write_text("[" * 30000)
    with pytest.raises(ValueError):
        controlfiles.read_json(folder, "requests.json", 32 * 1024)


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to give a file away"
)
def test_a_file_or_folder_of_another_user_is_refused(tmp_path: Path, folder: int) -> None:
    path = tmp_path / "control" / "requests.json"
    path.write_text("{}")
    os.chown(path, 65534, 65534)
    with pytest.raises(controlfiles.Refused, match="belongs to another user"):
        controlfiles.read_json(folder, "requests.json", 100)
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 65534, 65534)
    with pytest.raises(controlfiles.Refused, match="belongs to another user"):
        controlfiles.open_folder(str(other))


def test_a_folder_that_is_a_link_or_open_to_others_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(controlfiles.Refused, match="not a folder"):
        controlfiles.open_folder(str(tmp_path / "link"))
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(controlfiles.Refused, match="open to other users"):
        controlfiles.open_folder(str(tmp_path / "open"))


def test_a_write_never_goes_through_a_link_at_its_temporary_name(
    tmp_path: Path, folder: int
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "control" / f".proc.json.{os.getpid()}.tmp").symlink_to(victim)
    controlfiles.write_json(folder, "proc.json", {"step": 3})
    assert victim.read_text() == "keep"
    assert controlfiles.read_json(folder, "proc.json", 100) == {"step": 3}
    # the link is left as it was (the temporary name is random now: never the planted one), nothing
    # else is left
    planted = f".proc.json.{os.getpid()}.tmp"
    assert sorted(p.name for p in (tmp_path / "control").iterdir()) == [planted, "proc.json"]
    assert (tmp_path / "control" / planted).is_symlink()
