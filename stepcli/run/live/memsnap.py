"""`stepcli capture RUN --memory-snapshot`: every process of a running run dumps its CUDA allocator
snapshot now.

Rides on the stack-dump channel (stepcli/agent/stacks.py, stepcli/run/live/hangdoctor.py): a
`dump.<id>.json` request with `kind: memory` in the run's control folder, then the dump signal to
each registered process of this host. Each process's dump thread writes `memory-<worker>-<n>.pickle`
into the run folder (stepcli/agent/cudamemory.py) and answers in a private folder of the control
folder, which this removes once read.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from stepcli.agent.stacks import dump_signal
from stepcli.errors import EXIT_NOTHING_MEASURED, TraceError
from stepcli.inputs import read_side_json
from stepcli.run.live.hangdoctor import (
    DUMP_WAIT_S,
    _alive,
    _key,
    _new_folder,
    _write_control,
    local,
    registered,
)
from stepcli.runfolder.layout import MEMORY_ANSWER_SCHEMA, REQUEST_PREFIX
from stepcli.safetext import visible

_MAX_ANSWER = 64 * 1024


def capture_now(target: str, timeout: float, as_json: bool, memory_snapshot: bool) -> int:
    """`capture --stacks` or `--memory-snapshot` (the command checked that only one was given): both
    answer now and record no window."""
    if memory_snapshot:
        return capture_memory(target, timeout=timeout, as_json=as_json)
    from stepcli.run.live.hangdoctor import capture_stacks

    return capture_stacks(target, timeout=timeout, as_json=as_json)


def capture_memory(target: str, timeout: float, as_json: bool) -> int:
    """Ask every process for a CUDA memory snapshot; exit 0 when one was written, 3 when none
    was."""
    from stepcli.run.live.liverun import find_run

    run = find_run(target)
    expected = [p for p in registered(run.folder) if local(p) and p.get("signal") == dump_signal()]
    if not expected:
        _say(
            f"{target}: no stepping process of the run on this host can answer (none has stepped "
            f"yet?)"
        )
        return EXIT_NOTHING_MEASURED
    answers, silent = request_memory(run.folder, expected, min(timeout, DUMP_WAIT_S))
    written = [a for a in answers if a.get("snapshot")]
    if as_json:
        print(json.dumps({"snapshots": answers, "silent": silent}, indent=1))
    else:
        for line in describe(answers, silent, min(timeout, DUMP_WAIT_S)):
            print(visible(line))
    return 0 if written else EXIT_NOTHING_MEASURED


def request_memory(
    folder: str, expected: list[dict[str, Any]], wait_s: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(answers, processes that did not answer within wait_s)."""
    answers_dir = _new_folder(folder, "memory")
    request = f"{REQUEST_PREFIX}{answers_dir.name}.{os.getpid()}.json"
    _write_control(
        folder, request, {"id": answers_dir.name, "dir": str(answers_dir), "kind": "memory"}
    )
    try:
        for process in expected:
            try:
                os.kill(int(process["pid"]), int(process["signal"]))
            except (ProcessLookupError, PermissionError, KeyError, ValueError, TypeError):
                continue
        started = time.monotonic()
        while True:
            answered = {_key(a) for a in _read(answers_dir)}
            waiting = [p for p in expected if _key(p) not in answered and _alive(p)]
            if not waiting or time.monotonic() - started >= wait_s:
                break
            time.sleep(0.1)
    finally:
        try:
            _write_control(folder, request, None)
        except OSError:
            pass
    answers = _read(answers_dir)
    shutil.rmtree(answers_dir, ignore_errors=True)
    answered = {_key(a) for a in answers}
    return answers, [p for p in expected if _key(p) not in answered]


def _read(folder: Path) -> list[dict[str, Any]]:
    answers = []
    for path in sorted(folder.glob("*.json")):
        try:
            document = read_side_json(str(path), _MAX_ANSWER)  # (never blocking on a FIFO)
        except TraceError:
            continue
        if isinstance(document, dict) and document.get("schema") == MEMORY_ANSWER_SCHEMA:
            answers.append(document)
    return answers


def describe(
    answers: list[dict[str, Any]], silent: list[dict[str, Any]], wait_s: float
) -> list[str]:
    """One line per process: where its snapshot is, or why there is none."""
    lines = []
    for answer in sorted(answers, key=lambda a: str(a.get("worker"))):
        worker = answer.get("worker") or _key(answer)
        if answer.get("snapshot"):
            where = _short(str(answer["snapshot"]))
            line = (
                f"{worker}: memory snapshot at step {answer.get('step')} ({answer.get('phase')}) "
                f"in {where}"
            )
            if not answer.get("history"):
                line += (
                    " (segments only, no allocation history: the run was started without --memory)"
                )
            lines.append(line)
        else:
            lines.append(f"{worker}: {answer.get('reason') or 'no snapshot'}")
    for process in silent:
        worker = process.get("worker") or _key(process)
        lines.append(f"{worker}: did not answer within {wait_s:g} s")
    return lines


def _say(message: str) -> None:
    sys.stderr.write(f"stepcli: {visible(message)}\n")
    sys.stderr.flush()


def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
