"""The hang doctor, launcher side: `stepcli run --hang-timeout/--on-hang` and `stepcli capture
--stacks`.

Every stepping process registers for stack dumps in the run's control folder and, with a hang
timeout, marks itself stalled after that long without a step (stepcli/agent/stacks.py). A watch
thread in the launcher (stepcli.run.live.hangwatch) calls a hang when every live registered process
that trains is stalled; here each process on this host is asked for its stacks (a request file
naming `OUT/hang-<n>/`, then the dump signal). The block printed from them (who waits in which
collective, who is elsewhere and where) is built in stepcli/run/summary/hangreport.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stepcli.agent import controlfiles
from stepcli.agent.config import atomic_write_json
from stepcli.agent.stacks import dump_signal, fault_signal, process_start_ticks
from stepcli.errors import EXIT_NOTHING_MEASURED, StepcliError
from stepcli.run.summary.hangdump import (
    ProcessId,
    StackDump,
    is_stopped,
    parse_faulthandler,
    read_dumps,
)
from stepcli.run.summary.hangreport import describe_dumps
from stepcli.runfolder.layout import (
    REGISTER_PREFIX,
    REQUEST_PREFIX,
    STACKS_SCHEMA,
    out_of_control_dir,
)
from stepcli.safetext import visible

# dumps per hang with `--on-hang keep`: one when it is called, then one per timeout while it lasts
MAX_REPORTS = 3
DUMP_WAIT_S = 15.0  # how long the launcher waits for every process's stacks file
# `--on-hang kill`: SIGTERM, then SIGKILL this much later (time to save on a loaded host)
TERM_GRACE_S = 15.0
# faulthandler's C handler writes the fault file at once; past this, the dump is asked anyway
FAULT_WAIT_S = 3.0
# a process whose Python can run answers a probe well within this, even on a loaded host
PROBE_WAIT_S = 10.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """`10s`, `2m`, `1.5h`, `500ms`, or bare seconds (`30`) -> seconds; ValueError with the reason
    otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise ValueError(
            f"{text!r} is not a duration: use e.g. 30s, 10m, 1h (a number with s, m, h or ms)"
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds < 1.0:
        raise ValueError(f"{text!r} is too short: a hang timeout is at least 1s")
    return seconds


def check_options(hang_timeout: float | None, on_hang: str | None) -> str:
    """`--on-hang` only means something with `--hang-timeout`; returns the action (keep by
    default)."""
    if on_hang is not None and hang_timeout is None:
        raise StepcliError(f"--on-hang {on_hang} needs --hang-timeout DURATION")
    return on_hang or "keep"


# -- the control folder
# ------------------------------------------------------------------------------------------
def _tag(document: dict[str, Any]) -> str:
    return f"{document.get('host')}.{document.get('pid')}.json"


_MAX_CONTROL_BYTES = 1 << 20


# The control folder by its path, or by a descriptor held since the run made it: the hang watch
# holds one, so a `.stepcli` renamed away by another user (a shared folder) still leads it to the
# processes' files.
Folder = str | int


@contextmanager
def _opened(folder: Folder) -> Iterator[int]:
    """The control folder's descriptor: the one held (`folder` an int, left open), or opened and
    checked now."""
    if isinstance(folder, int):
        yield folder
        return
    fd = controlfiles.open_folder(folder)
    try:
        yield fd
    finally:
        os.close(fd)


def _documents(folder: Folder, prefix: str) -> dict[str, dict[str, Any]]:
    """The files `<prefix><host>.<pid>.json` of the control folder, by `<host>.<pid>.json`; only
    regular files of this user in the real control folder are read (stepcli/agent/controlfiles.py),
    never a link or a FIFO."""
    found: dict[str, dict[str, Any]] = {}
    try:
        with _opened(folder) as fd:
            for name in os.listdir(fd):
                if name.startswith(prefix) and name.endswith(".json"):
                    try:
                        document = controlfiles.read_json(fd, name, _MAX_CONTROL_BYTES)
                    except (OSError, ValueError):
                        continue
                    if isinstance(document, dict):
                        found[name[len(prefix) :]] = document
    except OSError:
        pass
    return found


def _write_control(folder: Folder, name: str, document: dict[str, Any] | None) -> None:
    """Write (or, with None, remove) `name` in the control folder, through its descriptor."""
    with _opened(folder) as fd:
        if document is None:
            controlfiles.unlink(fd, name)
        else:
            controlfiles.write_json(fd, name, document)


def local(process: dict[str, Any]) -> bool:
    return process.get("host") == socket.gethostname()


def _alive(process: dict[str, Any]) -> bool:
    """Still the process that registered (same pid and start time), not a zombie; other hosts' are
    trusted."""
    if not local(process):
        return True
    try:
        pid = int(process.get("pid", 0))
    except (TypeError, ValueError):
        return False
    started = process_start_ticks(pid)
    if started is None or started != process.get("start_ticks"):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def registered(folder: Folder) -> list[dict[str, Any]]:
    """The live processes that can dump their stacks."""
    return [p for p in _documents(folder, REGISTER_PREFIX).values() if _alive(p)]


def _new_folder(out_dir: str, kind: str) -> Path:
    """`OUT/<kind>-<n>/` with the first n not used yet: an earlier dump is never overwritten."""
    for n in range(1, 100_000):
        path = Path(out_dir) / f"{kind}-{n}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise StepcliError(f"cannot create {path}: {exc.strerror or exc}") from None
    raise StepcliError(f"{out_dir}: no free {kind}-<n> folder")


def request_stacks(
    folder: Folder,
    out_dir: str,
    kind: str,
    processes: list[dict[str, Any]],
    wait_s: float = DUMP_WAIT_S,
    unanswering: frozenset[str] = frozenset(),
) -> tuple[Path, list[StackDump], list[dict[str, Any]]]:
    """Ask every process on this host for its stacks into a new `OUT/<kind>-<n>/`; (folder, dumps,
    silent ones).

    Processes of other hosts are dumped by their own host's `stepcli run` (it sees the same control
    folder). `unanswering`: tags of processes known not to run Python (they answered no probe):
    nobody waits for their own dump, faulthandler's text stands in for it at once. A stopped process
    (SIGSTOP, a debugger) is not signalled (the signals would wait until it runs again, and dump
    then); its file says it is stopped."""
    target = _new_folder(out_dir, kind)
    request = f"{REQUEST_PREFIX}{target.name}.{os.getpid()}.json"
    _write_control(
        folder, request, {"id": target.name, "dir": str(target), "asked_at": time.time()}
    )
    expected = [p for p in processes if local(p) and p.get("signal") == dump_signal()]
    stopped = [p for p in expected if is_stopped(ProcessId.of(p))]
    expected = [p for p in expected if p not in stopped]
    offsets = {_key(p): _fault_read(folder, p)[0] for p in expected}
    try:
        # faulthandler drops a dump asked while another is being written (its handler is not
        # reentrant), so the Python-free dump into the fault file is asked first and let finish
        # before the one the thread answers.
        sizes = {
            _key(p): offsets[_key(p)]
            for p in expected
            if _signal(p, p.get("fault_signal"), fault_signal())
        }
        deadline = time.monotonic() + FAULT_WAIT_S
        while sizes and time.monotonic() < deadline:
            time.sleep(0.05)
            for process in expected:
                key = _key(process)
                if key in sizes:
                    size = _fault_read(folder, process)[0]
                    # written, and nothing more since the last look: the handler is done
                    if (offsets[key] < size == sizes[key]) or not _alive(process):
                        del sizes[key]
                    else:
                        sizes[key] = size
        for process in expected:
            _signal(process, process.get("signal"), dump_signal())
        started = time.monotonic()
        while True:
            written = {dump_key(d) for d in read_dumps(target)}
            waiting = [
                p
                for p in expected
                if _key(p) not in written and _tag(p) not in unanswering and _alive(p)
            ]
            elapsed = time.monotonic() - started
            if not waiting or elapsed >= wait_s:
                break
            time.sleep(0.1)
    finally:
        try:
            _write_control(folder, request, None)
        except OSError:
            pass
    written = {dump_key(d) for d in read_dumps(target)}
    for process in expected:
        if _key(process) not in written:
            _fallback_dump(process, folder, offsets.get(_key(process), 0), target)
    for process in stopped:
        _stopped_dump(process, target)
    dumps = read_dumps(target)
    written = {dump_key(d) for d in dumps}
    silent = [p for p in expected if _key(p) not in written]
    return target, dumps, silent


def _signal(process: dict[str, Any], signum: Any, expected: int | None) -> bool:
    """Send `signum` to the process when it is the signal this stepcli registers for (`expected`);
    whether sent."""
    if signum is None or signum != expected:
        return False
    try:
        os.kill(int(process["pid"]), int(signum))
    except (ProcessLookupError, PermissionError, KeyError, ValueError, TypeError):
        return False
    return True


def _key(process: dict[str, Any]) -> str:
    return f"{process.get('host')}.{process.get('pid')}"


def dump_key(dump: StackDump) -> str:
    """The process a stacks file is of, as _key names a registered one."""
    return f"{dump.process.host}.{dump.process.pid}"


def _fault_read(
    folder: Folder, process: dict[str, Any], offset: int | None = None
) -> tuple[int, str]:
    """(size of the process's fault file, its text from `offset`; none when `offset` is None), read
    through the control folder's descriptor: a regular file of this user, never a link or a FIFO."""
    name = process.get("fault_file")
    if not isinstance(name, str) or "/" in name or not name.startswith("fault."):
        return 0, ""
    try:
        with _opened(folder) as folder_fd:
            fd, info = controlfiles.open_regular(folder_fd, name)
    except OSError:
        return 0, ""
    try:
        if offset is None or info.st_size <= offset:
            return info.st_size, ""
        os.lseek(fd, offset, os.SEEK_SET)
        return info.st_size, os.read(fd, _MAX_CONTROL_BYTES).decode("utf-8", "replace")
    except OSError:
        return 0, ""
    finally:
        os.close(fd)


def _fallback_dump(process: dict[str, Any], folder: Folder, offset: int, target: Path) -> None:
    """A process that wrote no stacks file (its Python threads cannot run): faulthandler's text,
    written by its C signal handler into its fault file, becomes its stacks file."""
    _, text = _fault_read(folder, process, offset)
    threads = parse_faulthandler(text, process.get("main_thread"))
    if not threads:
        return
    _write_launcher_dump(process, target, "faulthandler", threads, text)


def _stopped_dump(process: dict[str, Any], target: Path) -> None:
    """A stopped process (SIGSTOP, or held by a debugger) can write nothing: its file says who it is
    and that it is stopped (`"source": "stopped"`, no threads), so the summary and the report name
    it."""
    _write_launcher_dump(process, target, "stopped", [], None)


def _write_launcher_dump(
    process: dict[str, Any], target: Path, source: str, threads: list[Any], text: str | None
) -> None:
    """The stacks file the launcher writes for a process that wrote none itself (`source` says
    why)."""
    worker = str(process.get("worker") or f"{process.get('host')}_{process.get('pid')}")
    document: dict[str, Any] = {
        "schema": STACKS_SCHEMA,
        "request": target.name,
        "source": source,
        "pid": process.get("pid"),
        "host": process.get("host"),
        "rank": process.get("rank"),
        "worker": worker,
        "time": time.time(),
        "step": None,
        "last_step_s_ago": None,
        "collective": None,
        "collectives_hooked": False,
        "threads": threads,
        "faulthandler": text,
    }
    atomic_write_json(
        str(target / f"{worker}.{process.get('host')}.{process.get('pid')}.json"), document, 0o600
    )


# -- `stepcli capture --stacks`
# ----------------------------------------------------------------------------------
def capture_stacks(target: str, timeout: float, as_json: bool) -> int:
    """Dump the stacks of a running `stepcli run` now into `OUT/stacks-<n>/`; exit 3 when no process
    answered."""
    from stepcli.run.live.liverun import find_run

    run = find_run(target)
    out_dir = out_of_control_dir(str(run.folder))
    processes = registered(run.folder)
    if not any(local(p) for p in processes):
        _say(
            f"{target}: no stepping process of the run on this host can dump its stacks (none has "
            f"stepped yet?)"
        )
        return EXIT_NOTHING_MEASURED
    folder, dumps, silent = request_stacks(
        run.folder, out_dir, "stacks", processes, wait_s=min(timeout, DUMP_WAIT_S)
    )
    if as_json:
        stacks = [dict(d.document) for d in dumps]
        print(json.dumps({"folder": str(folder), "stacks": stacks, "silent": silent}, indent=1))
    else:
        print(
            visible(
                f"stacks of {len(dumps)} process{'es' if len(dumps) != 1 else ''} in "
                f"{_short(folder)}/"
            )
        )
        for line in describe_dumps(dumps, [ProcessId.of(p) for p in silent]):
            # frame paths and names come from the program: no ESC/OSC/BEL or bidi
            print(visible(line))
    return 0 if dumps else EXIT_NOTHING_MEASURED


def _say(message: str) -> None:
    # frame paths and names: no ESC/OSC/BEL or bidi
    sys.stderr.write(f"stepcli: {visible(message)}\n")
    sys.stderr.flush()


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
