"""The hang doctor's pure parts: durations, the printed block, collective numbering, the stall
marker."""

from __future__ import annotations

import json
import os
import socket
import types
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stepcli.agent import lastcollective as collectives
from stepcli.agent.stacks import StackDumper
from stepcli.agent.tracker import StepTracker
from stepcli.errors import StepcliError
from stepcli.run.live.hangdoctor import check_options, parse_duration
from stepcli.run.summary.hangdump import Frame, ProcessId, StackDump, parse_faulthandler
from stepcli.run.summary.hangreport import describe_dumps, verdict
from stepcli.run.summary.hangverdict import own_frame
from stepcli.run.summary.hangwords import summary_lines as typed_summary_lines
from stepcli.runfolder.layout import STALL_PREFIX
from stepcli.runfolder.summaryfile import HangSection


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("2m", 120.0), ("1.5h", 5400.0), ("1500ms", 1.5), ("30", 30.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "10x", "-5s", "1e3", "ten seconds", "0.5s", "999ms"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_on_hang_needs_a_timeout_and_keeps_by_default() -> None:
    assert check_options(10.0, None) == "keep"
    assert check_options(10.0, "kill") == "kill"
    with pytest.raises(StepcliError, match="needs --hang-timeout"):
        check_options(None, "kill")


def _dump(
    rank: int, collective: dict[str, Any] | None, frames: list[tuple[str, str]]
) -> dict[str, Any]:
    """A stacks file's document, as stepcli/agent/stacks.py writes it."""
    return {
        "rank": rank,
        "pid": 100 + rank,
        "host": "h",
        "step": 5,
        "collective": collective,
        "collectives_hooked": True,
        "threads": [
            {
                "name": "Thread-1",
                "main": False,
                "frames": [{"function": "spin", "file": "/x/t.py", "line": 1}],
            },
            {
                "name": "MainThread",
                "main": True,
                "frames": [
                    {"function": f, "file": path, "line": i + 1}
                    for i, (f, path) in enumerate(frames)
                ],
            },
        ],
    }


def _typed(documents: list[dict[str, Any]]) -> list[StackDump]:
    return [StackDump.of(document) for document in documents]


def _waiting(seq: int, name: str = "all_reduce") -> dict[str, Any]:
    return {"name": name, "seq": seq, "entered_s_ago": 12.0, "returned": False}


def test_the_block_names_who_waits_in_what_and_where_the_other_is() -> None:
    stdlib = str(Path(json.__file__).parent.parent / "threading.py")
    dumps = [
        _dump(
            1,
            {"name": "all_reduce", "seq": 5, "returned": True},
            [("wait", stdlib), ("stuck", "/app/train.py")],
        ),
        _dump(0, _waiting(6), [("all_reduce", "/x/c10d.py")]),
    ]
    lines = describe_dumps(_typed(dumps), [ProcessId(102, "h", 2)])
    assert lines[0] == "  rank 0 (pid 100): waits in all_reduce #6 (entered 12.0 s ago), step 5"
    assert lines[1].startswith(
        "  rank 1 (pid 101): not in a collective (its last, all_reduce #5, returned; "
    )
    # main thread, innermost first
    assert lines[2:4] == [f"      wait ({stdlib}:1)", "      stuck (/app/train.py:2)"]
    assert lines[4].startswith("  rank 2 (pid 102): wrote no stacks")
    # the verdict skips the standard library's frames: the program's own function is where it is
    # stuck
    assert lines[5] == (
        "-> rank 1 (pid 101) is in stuck (/app/train.py:2) while 1 process waits in all_reduce #6: "
        "it holds the job back"
    )


def test_verdicts_when_everybody_waits() -> None:
    assert verdict(_typed([_dump(0, _waiting(6), []), _dump(1, _waiting(6), [])])) == (
        "-> every process waits in all_reduce #6: a peer outside this dump, or the transport, is "
        "stuck"
    )
    mismatched = verdict(_typed([_dump(0, _waiting(6), []), _dump(1, _waiting(6, "barrier"), [])]))
    assert (
        mismatched is not None and "different collectives (all_reduce #6, barrier #6)" in mismatched
    )
    # without the flight recorder, a collective issued from C++ (DDP's reducer) cannot be seen: said
    # unknown
    assert verdict(_typed([_dump(0, None, [("f", "/a.py")])])) == (
        "-> no process waits in a collective called from Python; whether one waits in a collective "
        "issued from C++ is unknown (no flight recorder)"
    )
    # known: none in flight
    assert verdict(_typed([{**_dump(0, None, [("f", "/a.py")]), "in_flight": []}])) is None


def test_a_collective_in_flight_in_the_process_group_is_waited_in() -> None:
    flight = {"name": "all_reduce", "seq": 26, "group": "default_pg", "entered_s_ago": 4.2}
    reducer = {
        **_dump(0, None, [("_engine_run_backward", "/torch/autograd/graph.py"), ("main", "/t.py")])
    }
    reducer["in_flight"] = [flight]
    elsewhere = {**_dump(1, None, [("stuck", "/t.py")]), "in_flight": []}
    block = describe_dumps(_typed([reducer, elsewhere]), [])
    assert block[0].startswith(
        "  rank 0 (pid 100): waits in all_reduce #26 of process group default_pg (in flight,"
    )
    assert "issued from C++" in block[0]
    assert block[-1].startswith("-> rank 1 (pid 101) is in stuck (/t.py:")
    assert block[-1].endswith("while 1 process waits in all_reduce #26: it holds the job back")
    unknown = verdict(_typed([{**reducer, "in_flight": None}, {**elsewhere, "in_flight": None}]))
    assert unknown is not None and unknown.endswith(
        "; rank 0 (pid 100) is in backward() (autograd's C++ engine, where DDP all-reduces)"
    )


def test_collectives_are_numbered_once_each_and_marked_returned() -> None:
    calls: list[str] = []
    fake = types.ModuleType("fake_dist")

    def all_reduce(tensor: Any, group: Any = None, async_op: bool = False) -> str:
        calls.append("all_reduce")
        return "done"

    def all_gather_object(out: Any, obj: Any) -> None:
        calls.append("all_gather_object")
        fake.all_reduce(obj)  # an object collective that makes another collective: counted once

    def barrier() -> None:
        raise RuntimeError("peer gone")

    fake.all_reduce, fake.all_gather_object, fake.barrier = all_reduce, all_gather_object, barrier  # type: ignore[attr-defined]
    last = collectives.LAST
    saved = {name: getattr(last, name) for name in last.__slots__}
    try:
        last.seq = 0
        collectives.hook_collectives(fake)
        collectives.hook_collectives(fake)  # twice: not wrapped twice
        assert (
            fake.all_reduce(1, async_op=True, group=types.SimpleNamespace(group_name="tp"))
            == "done"
        )
        assert (last.to_dict(0.0) or {})["group"] == "tp" and (last.to_dict(0.0) or {})[
            "async_op"
        ] is True
        assert last.to_dict(last.entered_at) == {
            **last.to_dict(last.entered_at),
            "name": "all_reduce",
            "seq": 1,
        }  # type: ignore[dict-item]
        fake.all_gather_object([], 2)
        assert (last.name, last.seq) == ("all_gather_object", 2)
        assert calls == ["all_reduce", "all_gather_object", "all_reduce"]
        with pytest.raises(RuntimeError):
            fake.barrier()
        state = last.to_dict(last.returned_at)
        assert (
            state is not None
            and state["name"] == "barrier"
            and state["seq"] == 3
            and state["returned"]
        )
        last.depth = 1  # inside a call: not returned
        inside = last.to_dict(last.entered_at)
        assert inside is not None and inside["returned"] is False
        assert fake.all_reduce.__wrapped__ is all_reduce  # type: ignore[attr-defined]
    finally:
        for name, value in saved.items():
            setattr(last, name, value)


def test_a_process_marks_itself_stalled_after_the_timeout_and_unmarks_when_it_steps(
    tmp_path: Path,
) -> None:
    tracker = StepTracker()
    agent = types.SimpleNamespace(tracker=tracker)
    dumper = StackDumper(agent, str(tmp_path), 0, hang_timeout=10.0)  # type: ignore[arg-type]
    marker = tmp_path / f"{STALL_PREFIX}{dumper.tag}"
    dumper._watch_steps()
    assert not marker.exists()
    dumper._step_mono -= 11.0  # eleven seconds without a step
    dumper._watch_steps()
    assert json.loads(marker.read_text())["step"] == 0 and dumper.stalled
    tracker.step("opt")
    dumper._watch_steps()
    assert not marker.exists() and not dumper.stalled
    dumper.forked()  # closes its pipe


FAULTHANDLER_TEXT = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/app/worker.py", line 9 in loop

Current thread 0x00007f0000000001 (most recent call first):
  File "/app/train.py", line 12 in spin
  File "/app/train.py", line 20 in <module>
"""


def test_faulthandler_text_becomes_threads_innermost_first() -> None:
    threads = parse_faulthandler(FAULTHANDLER_TEXT, main_thread=0x7F0000000001)
    assert [(t["id"], t["main"]) for t in threads] == [
        (0x7F0000000002, False),
        (0x7F0000000001, True),
    ]
    assert threads[1]["frames"] == [
        {"function": "spin", "file": "/app/train.py", "line": 12},
        {"function": "<module>", "file": "/app/train.py", "line": 20},
    ]
    # two dumps appended to the same file: the newest is kept
    assert (
        len(parse_faulthandler(FAULTHANDLER_TEXT + FAULTHANDLER_TEXT.replace("12", "13"), None))
        == 2
    )
    assert parse_faulthandler(FAULTHANDLER_TEXT * 2, None)[1]["frames"][0]["line"] == 12
    assert parse_faulthandler("", None) == []


def test_the_dump_is_asked_only_once_the_fault_text_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """faulthandler drops a dump asked while it writes another: the two signals must never
    overlap."""
    from stepcli.agent.stacks import dump_signal, fault_signal
    from stepcli.run.live import hangdoctor as hang

    if fault_signal() is None:
        pytest.skip("no real-time signals on this platform")
    sent: list[tuple[int, int]] = []  # (signal, fault file size when it was sent)
    fault = {"size": 0, "writes": 0}

    def kill(pid: int, signum: int) -> None:
        sent.append((signum, fault["size"]))

    def fault_read(
        folder: str, process: dict[str, Any], offset: int | None = None
    ) -> tuple[int, str]:
        # the handler writes in pieces
        if any(s == fault_signal() for s, _ in sent) and fault["writes"] < 4:
            fault["writes"] += 1
            fault["size"] += 100
        return fault["size"], ""

    process = {
        "pid": 4242,
        "host": socket.gethostname(),
        "signal": dump_signal(),
        "fault_signal": fault_signal(),
    }
    monkeypatch.setattr(hang.os, "kill", kill)
    monkeypatch.setattr(hang, "_fault_read", fault_read)
    monkeypatch.setattr(hang, "_alive", lambda p: True)
    monkeypatch.setattr(hang, "_write_control", lambda *args: None)
    monkeypatch.setattr(
        hang,
        "read_dumps",
        lambda target: _typed([{"host": process["host"], "pid": 4242}]) if len(sent) > 1 else [],
    )
    hang.request_stacks(str(tmp_path), str(tmp_path), "stacks", [process], wait_s=1.0)
    assert sent == [(fault_signal(), 0), (dump_signal(), 400)]


def summary_lines(section: dict[str, Any] | None, short: Any = str) -> list[str]:
    """The block of a `hang` section written as JSON, typed as the summary's loader types it."""
    typed = msgspec.convert(section, HangSection) if section is not None else None
    return typed_summary_lines(typed, short)


def _entry(
    rank: int | None, waiting: bool, collective: dict[str, Any] | None, frame: tuple[str, str, int]
) -> Any:
    """One process of the run summary's `hang` report, as hang_summary writes it."""
    function, file, line = frame
    return {
        "worker": f"rank{rank}",
        "rank": rank,
        "pid": 100 + (rank or 0),
        "host": "h",
        "step": 5,
        "collective": collective,
        "waiting": waiting,
        "where": f"{function} ({file}:{line})",
        "frame": {"function": function, "file": file, "line": line},
        "source": "python",
        "file": f"rank{rank}.h.{100 + (rank or 0)}.json",
    }


HELD_BACK = {
    "reports": [
        {
            "folder": "/runs/out/hang-1",
            "idle_s": 10.4,
            "processes": [
                _entry(0, True, _waiting(6), ("main", "/work/train.py", 20)),
                _entry(
                    1,
                    False,
                    {"name": "all_reduce", "seq": 5, "returned": True},
                    ("stuck", "/work/train.py", 12),
                ),
            ],
            "verdict": "-> rank 1 (pid 101) is in stuck (/work/train.py:12) while 1 process waits "
            "in all_reduce #6: it holds the job back",
        }
    ],
    "timeout_s": 10.0,
    "on_hang": "kill",
    "ended_job": True,
}


def test_the_summary_block_says_when_who_why_where_and_that_the_job_was_ended() -> None:
    lines = summary_lines(HELD_BACK, lambda path: path.replace("/runs/", ""))
    assert lines == [
        "hang: at step 5, no process completed a step for 10.4 s",
        "  rank 1 holds the job back: in stuck (train.py:12), not in a collective",
        "  rank 0 waits in all_reduce #6",
        "  stacks of every process: out/hang-1/",
        "  --on-hang kill ended the job: exit status 124",
    ]


def test_the_summary_block_fits_80_columns_and_has_no_trailing_spaces() -> None:
    long_name = "a_function_with_a_name_long_enough_to_need_a_second_line_of_its_own_" * 2
    section = json.loads(json.dumps(HELD_BACK))
    report = section["reports"][0]
    report["processes"][1]["frame"]["function"] = long_name
    report["processes"] += [
        _entry(r, True, _waiting(6), ("main", "/w/t.py", 1)) for r in (2, 3, 4, 6, 7)
    ]
    report["folder"] = "/a/very/long/output/folder/" + "x" * 80 + "/hang-1"
    lines = summary_lines(section)
    path = f"  {report['folder']}/"
    # never cut
    assert path in lines and lines[lines.index(path) - 1] == "  stacks of every process:"
    assert all(len(line) <= 80 and line == line.rstrip() for line in lines if line != path), lines
    assert "  ranks 0, 2-4, 6-7 wait in all_reduce #6" in lines
    assert "".join(lines).replace(" ", "").count(long_name) == 1  # wrapped, not lost


def test_the_summary_block_for_other_verdicts_and_repeated_reports() -> None:
    waiters = [_entry(r, True, _waiting(6), ("main", "/t.py", 1)) for r in (0, 1)]
    everybody = {
        "reports": [
            {"folder": f"o/hang-{n}", "idle_s": 30.0 * n, "processes": waiters} for n in (1, 2)
        ],
        "on_hang": "keep",
        "ended_job": False,
    }
    assert summary_lines(everybody) == [
        "hang: at step 5, no process completed a step for 30.0 s",
        "  every process waits in all_reduce #6: a peer outside this dump, or the",
        "    transport, is stuck",
        "  stacks of every process: o/hang-1/",
        "hang: at step 5, no process completed a step for 60.0 s, as above",
        "  stacks of every process: o/hang-2/",
        "  --on-hang keep: the job was left running",
    ]
    mismatched = {
        "reports": [
            {
                "folder": "o/hang-1",
                "idle_s": None,
                "processes": [
                    _entry(0, True, _waiting(6), ("m", "/t.py", 1)),
                    _entry(1, True, _waiting(6, "barrier"), ("m", "/t.py", 1)),
                ],
            }
        ],
        "timeout_s": 60.0,
    }
    assert summary_lines(mismatched)[:4] == [
        "hang: at step 5, no process completed a step for 60 s or more",
        "  the processes wait in different collectives: mismatched collectives",
        "  rank 0 waits in all_reduce #6",
        "  rank 1 waits in barrier #6",
    ]
    gil = json.loads(json.dumps(HELD_BACK))
    gil["reports"][0]["processes"][1].update(source="faulthandler", step=None, collective=None)
    assert summary_lines(gil)[1:3] == [
        "  rank 1 holds the job back: in stuck (train.py:12), stuck in C code that holds",
        "    the GIL (its Python could not run)",
    ]
    alone = {
        "reports": [
            {"folder": "o/hang-1", "processes": [_entry(None, False, None, ("nap", "/n.py", 3))]}
        ]
    }
    # nothing says when: no step, no time, no timeout
    alone["reports"][0]["processes"][0]["step"] = None
    assert summary_lines(alone) == [
        "hang: no process completed a step",
        "  no process waits in a collective called from Python; collectives issued from",
        "    C++ are unknown",
        "  pid 100 is in nap (n.py:3)",
        "  stacks of every process: o/hang-1/",
    ]


@pytest.mark.parametrize("section", [None, {}, {"reports": []}])
def test_no_hang_no_block(section: Any) -> None:
    # (a section that is no object, or reports that are none, are refused at reading:
    # test_runsummary)
    assert summary_lines(section) == []


def test_the_programs_own_frame_skips_the_standard_library_and_stepcli() -> None:
    import stepcli.agent.lastcollective as wrapper

    frames = [
        {
            "function": "wait",
            "file": str(Path(json.__file__).parent.parent / "threading.py"),
            "line": 1,
        },
        # the collective's wrapper
        {"function": "stepcli_collective", "file": wrapper.__file__, "line": 99},
        # a package installed outside this interpreter's paths (a .pth file, PYTHONPATH): still not
        # the program's
        {
            "function": "all_reduce",
            "file": "/opt/env/lib/python3.11/site-packages/torch/distributed/c10d.py",
            "line": 7,
        },
        {"function": "main", "file": "/work/train.py", "line": 20},
    ]
    typed = [Frame.of(f) for f in frames]
    assert own_frame(typed) == typed[3]  # type: ignore[arg-type]
    # nothing of the program's: the innermost
    assert own_frame(typed[:2]) == typed[0]  # type: ignore[arg-type]


def test_a_stopped_rank_is_named_as_the_one_holding_the_job_back() -> None:
    # (issue 30, item 15) a SIGSTOPped rank writes no stacks: say it is stopped, and that it holds
    # the others back
    import signal
    import subprocess
    import sys
    import time

    from stepcli.run.summary.hangdump import is_stopped

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        process = ProcessId(child.pid, socket.gethostname(), 1)
        deadline = time.monotonic() + 30
        # the state changes as the signal lands
        while not is_stopped(process) and time.monotonic() < deadline:
            time.sleep(0.01)
        lines = describe_dumps(
            _typed([_dump(0, _waiting(7), [("all_reduce", "/x/c10d.py")])]), [process]
        )
    finally:
        child.kill()
        child.wait()
    assert (
        lines[1]
        == f"  rank 1 (pid {child.pid}): stopped (SIGSTOP, or held by a debugger): it can neither "
        f"run nor answer"
    )
    assert (
        lines[-1]
        == f"-> rank 1 (pid {child.pid}) is stopped while 1 process waits in all_reduce #7: it "
        f"holds the job back"
    )


def test_a_stopped_process_s_file_names_it_in_the_block_the_summary_and_the_verdict(
    tmp_path: Path,
) -> None:
    # (issue 30, item 15) the launcher writes a file for a stopped process ("source": "stopped", no
    # threads)
    from stepcli.run.summary.hangreport import hang_summary

    stopped = {
        "rank": 1,
        "pid": 4243,
        "host": "h",
        "source": "stopped",
        "threads": [],
        "step": None,
        "time": 1.0,
    }
    waiting = _dump(0, _waiting(7), [("all_reduce", "/x/c10d.py")])
    lines = describe_dumps(_typed([waiting, stopped]), [])
    assert (
        "  rank 1 (pid 4243): stopped (SIGSTOP, or held by a debugger): it can neither run nor "
        "answer" in lines
    )
    assert (
        lines[-1]
        == "-> rank 1 (pid 4243) is stopped while 1 process waits in all_reduce #7: it holds the "
        "job back"
    )
    alone = {k: v for k, v in stopped.items() if k != "rank"}
    assert (
        describe_dumps(_typed([alone]), [])[-1]
        == "-> pid 4243 on h is stopped: it holds the job back"
    )
    folder = tmp_path / "hang-1"
    folder.mkdir()
    (folder / "p.h.4243.json").write_text(json.dumps(alone))
    section = hang_summary([str(folder)], 0.0, timeout_s=2.0, on_hang="kill", ended_job=True)
    assert section is not None
    (report,) = section.reports
    assert report.verdict == "-> pid 4243 on h is stopped: it holds the job back"
    assert typed_summary_lines(section, lambda path: "out/hang-1") == [
        "hang: no process completed a step for 2 s or more",
        "  pid 4243 holds the job back: stopped (SIGSTOP, or held by a debugger)",
        "  stacks of every process: out/hang-1/",
        "  --on-hang kill ended the job: exit status 124",
    ]


def test_a_process_that_joined_its_job_waits_unstalled_until_it_trains(tmp_path: Path) -> None:
    # GIVEN a process registered when it joined its job (init_process_group), before any sign of
    # training
    tracker = StepTracker()
    dumper = StackDumper(
        types.SimpleNamespace(tracker=tracker), str(tmp_path), 0, 10.0, training=False
    )  # type: ignore[arg-type]
    dumper._register()
    register = tmp_path / f"stacks.{dumper.tag}"
    marker = tmp_path / f"{STALL_PREFIX}{dumper.tag}"
    assert json.loads(register.read_text())["training"] is False
    # THEN however long it goes without a step, it never marks itself stalled
    dumper._step_mono -= 100.0
    dumper._watch_steps()
    assert not marker.exists() and not dumper.stalled
    # WHEN it starts to train: its stall clock starts then, and its registration says so
    dumper.train()
    assert json.loads(register.read_text())["training"] is True
    dumper._watch_steps()
    assert not marker.exists()
    dumper._step_mono -= 11.0
    dumper._watch_steps()
    assert marker.exists() and dumper.stalled
    dumper.forked()  # closes its pipe


def test_a_hang_is_called_without_waiting_for_a_process_that_never_trained(tmp_path: Path) -> None:
    from stepcli.agent import controlfiles
    from stepcli.run.live.hangwatch import HangWatch

    # GIVEN (another host's) rank 0 stalled since t=100 and rank 1 registered when it joined, never
    # training
    watch = HangWatch(types.SimpleNamespace(out_dir=str(tmp_path), run_id="r"), 5.0, "keep", None)  # type: ignore[arg-type]
    watch.folder = str(tmp_path)
    folder = controlfiles.open_folder(str(tmp_path))
    try:
        for pid, training in ((1, True), (2, False)):
            document = {"pid": pid, "host": "node9", "rank": pid - 1, "training": training}
            controlfiles.write_json(folder, f"stacks.node9.{pid}.json", document)
        controlfiles.write_json(
            folder, "stall.node9.1.json", {"pid": 1, "host": "node9", "last_step_at": 100.0}
        )
        # THEN the hang is called, and both are to be dumped
        state = watch.hung()
        assert (
            state is not None and state[0] == 100.0 and sorted(p["pid"] for p in state[1]) == [1, 2]
        )
        # WHEN rank 1 trains and is not stalled: it may be stepping (another host's), so no hang
        controlfiles.write_json(
            folder, "stacks.node9.2.json", {"pid": 2, "host": "node9", "training": True}
        )
        assert watch.hung() is None
    finally:
        os.close(folder)


def test_init_process_group_tells_the_agent_before_it_may_block() -> None:
    order: list[str] = []
    fake = types.ModuleType("fake_dist")

    def init_process_group(backend: str = "gloo") -> str:
        order.append(f"init {backend}")
        return "joined"

    fake.init_process_group = init_process_group  # type: ignore[attr-defined]
    collectives.hook_collectives(fake, lambda: order.append("joined_job"))
    collectives.hook_collectives(fake, lambda: order.append("again"))  # twice: not wrapped twice
    assert fake.init_process_group("nccl") == "joined"
    assert order == ["joined_job", "init nccl"]
    assert fake.init_process_group.__wrapped__ is init_process_group  # type: ignore[attr-defined]
    plain = types.ModuleType("plain_dist")
    plain.init_process_group = init_process_group  # type: ignore[attr-defined]
    collectives.hook_collectives(plain)  # no agent to tell: left as it is
    assert plain.init_process_group is init_process_group  # type: ignore[attr-defined]


def test_a_dump_that_shows_the_job_stepped_on_is_no_hang(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stepcli.run.live import hangwatch as hangdoctor

    # GIVEN a process whose stall file said step 21, dumped when it had already stepped on to step
    # 22
    watch = hangdoctor.HangWatch(
        types.SimpleNamespace(out_dir=str(tmp_path), run_id="r"), 1.0, "kill", None
    )  # type: ignore[arg-type]
    watch._stalled_at = {"node9.7.json": 21}
    target = tmp_path / "hang-1"

    def dumped(*args: Any, **kwargs: Any) -> tuple[Path, list[StackDump], list[dict[str, Any]]]:
        target.mkdir()
        (target / "rank0.node9.7.json").write_text("{}")
        return target, _typed([{"host": "node9", "pid": 7, "step": step}]), []

    monkeypatch.setattr(hangdoctor, "request_stacks", dumped)
    said: list[str] = []
    monkeypatch.setattr(hangdoctor, "_say", said.append)
    # THEN nothing is reported, kept or said (and --on-hang kill ends nothing: _run goes on)
    step = 22
    assert watch._report(100.0, [], 1) is False
    assert not target.exists() and watch.folders == [] and said == []
    # WHEN the dump shows the step it stalled at: the hang stands
    step = 21
    assert watch._report(100.0, [], 1) is True
    assert watch.folders == [str(target)] and said[0].startswith(
        "hang: no process completed a step"
    )


def test_a_hang_dropped_as_over_is_looked_at_again_when_the_stalled_processes_change(
    tmp_path: Path,
) -> None:
    import threading

    from stepcli.run.live.hangwatch import HangWatch

    # GIVEN A and B stalled since t=100; A steps on while they are dumped (the dump is dropped),
    # then A exits and B alone stays stalled since t=100: the same `since`, another set of processes
    watch = HangWatch(types.SimpleNamespace(out_dir=str(tmp_path), run_id="r"), 1.0, "keep", None)  # type: ignore[arg-type]
    reported: list[frozenset[str]] = []
    two = threading.Event()

    def hung() -> tuple[float, list[dict[str, Any]]]:
        watch._stalled_at = {"A": 5, "B": 5} if not reported else {"B": 5}
        return 100.0, []

    def report(since: float, processes: list[dict[str, Any]], repeat: int) -> bool:
        reported.append(frozenset(watch._stalled_at))
        if len(reported) == 2:
            two.set()
        return len(reported) > 1  # the first dump showed A past step 5

    watch.hung = hung  # type: ignore[method-assign]
    watch._report = report  # type: ignore[method-assign]
    watch.start()
    try:
        # THEN B's hang is reported (it was skipped for good when only the time was compared)
        assert two.wait(30), reported
    finally:
        watch.stop()
    assert reported[:2] == [frozenset({"A", "B"}), frozenset({"B"})]
