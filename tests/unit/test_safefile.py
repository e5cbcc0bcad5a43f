"""Every file stepcli creates goes through stepcli.safefile (issue 30): a link planted at a name
stepcli uses is never written through, a FIFO never blocks, a folder put in place of the control
folder is never written into.

"Planted" links are made by the same user here: what matters is that stepcli never follows them,
whoever made them. The names planted are those the old code used (`<name>.<pid>.tmp` and `-<pid>`
probes, with the test process's own pid, the pid these writers run under here): they hit every time
before; now no temporary name can be guessed, and a link at the final name is replaced, not
followed.
"""

from __future__ import annotations

import os
import pickle
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from stepcli import safefile
from stepcli.agent import cudamemory
from stepcli.agent.config import atomic_write_json
from stepcli.agent.controlfiles import Refused
from stepcli.agent.output import export_trace, worker_name
from stepcli.errors import StepcliError
from stepcli.report import write_html, write_new_file
from stepcli.run import outputs
from stepcli.run.summary.build import write_run_summary
from stepcli.traces.mergetraces import check_output

SECRET = b"the user's own private file\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A private file of the user, outside the folder: what a planted link points at."""
    path = tmp_path / "elsewhere" / "victim"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def _plant(folder: Path, names: list[str], target: Path) -> None:
    for name in names:
        (folder / name).symlink_to(target)


def _snapshot() -> dict[str, object]:
    return {"segments": [], "device_traces": [], cudamemory.SNAPSHOT_KEY: {"step": 1}}


PID = os.getpid()


class _FakeProfiler:
    """export_chrome_trace as Kineto does it: by name, through `<path>.tmp` and a rename."""

    def export_chrome_trace(self, path: str) -> None:
        with open(path + ".tmp", "w") as handle:
            handle.write('{"traceEvents": [], "traceName": "' + path + '"}')
        os.replace(path + ".tmp", path)


# (writer given the folder, the names the old code used in it, the file it leaves)
WRITERS: dict[str, tuple[Callable[[Path], object], list[str], str]] = {
    "report.html": (
        lambda d: write_html("<html></html>", str(d / "report.html")),
        [f".report.html.{PID}.tmp"],
        "report.html",
    ),
    "report -o (new file)": (
        lambda d: write_new_file("<html></html>", str(d / "report-2.html")),
        [f".report-2.html.{PID}.tmp"],
        "report-2.html",
    ),
    "--json": (
        lambda d: write_run_summary({}, str(d / "run.json")),
        [f".run.json.{PID}.tmp"],
        "run.json",
    ),
    "--json probe": (
        lambda d: outputs.check_json_writable(str(d / "run.json")),
        [f".stepcli-json-test-{PID}"],
        "",
    ),
    "output folder probe": (
        lambda d: outputs.prepare_out_dir(str(d), "x"),
        [f".stepcli-write-test-{PID}"],
        "",
    ),
    "agent JSON": (
        lambda d: atomic_write_json(str(d / "x.json"), {"a": 1}),
        [f".x.json.{PID}.tmp"],
        "x.json",
    ),
    "OOM snapshot": (
        lambda d: cudamemory._write_snapshot(str(d), _snapshot()),
        [f".oom-{worker_name()}.pickle.{PID}.tmp"],
        f"oom-{worker_name()}.pickle",
    ),
    "on-demand snapshot": (
        lambda d: cudamemory._write_numbered(str(d), _snapshot()),
        [f".memory-{worker_name()}.{PID}.tmp"],
        f"memory-{worker_name()}-1.pickle",
    ),
}


@pytest.mark.parametrize("what", sorted(WRITERS))
def test_a_link_planted_at_a_temporary_name_is_never_written_through(
    tmp_path: Path, victim: Path, what: str
) -> None:
    # GIVEN links planted at the names the writer used to open by name
    write, planted, final = WRITERS[what]
    folder = tmp_path / "out"
    folder.mkdir()
    _plant(folder, planted, victim)
    # WHEN it writes
    write(folder)
    # THEN the user's file is untouched, and what was written is a regular file of its own
    assert victim.read_bytes() == SECRET
    if final:
        assert stat.S_ISREG(os.lstat(folder / final).st_mode)
    # nothing left over
    assert not [p for p in folder.iterdir() if ".tmp" in p.name and not p.is_symlink()]


@pytest.mark.parametrize("what", ["report.html", "--json", "agent JSON"])
def test_a_link_planted_at_the_final_name_is_replaced_not_followed(
    tmp_path: Path, victim: Path, what: str
) -> None:
    write, _, final = WRITERS[what]
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / final).symlink_to(victim)
    write(folder)
    assert victim.read_bytes() == SECRET
    assert not (folder / final).is_symlink()


@pytest.mark.parametrize("what", ["OOM snapshot", "on-demand snapshot"])
def test_snapshots_are_private_and_never_replace_a_planted_name(
    tmp_path: Path, victim: Path, what: str
) -> None:
    write, _, final = WRITERS[what]
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / final).symlink_to(victim)
    path = Path(str(write(folder)))
    # the link kept, not followed
    assert victim.read_bytes() == SECRET and (folder / final).is_symlink()
    # allocation stacks, argv
    assert path != folder / final and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert pickle.loads(path.read_bytes())["segments"] == []
    assert cudamemory.WRITTEN[-1] == path.name  # named in the process's step log


def test_temporary_names_cannot_be_guessed(tmp_path: Path) -> None:
    # 100 names: each a fresh 16-hex-digit tag (64 random bits), none repeated, none the process id.
    # (Not "the pid's digits appear nowhere in the tag": a random tag holds a 3-digit pid by chance
    # ~1 time in 300.)
    names = {safefile.temp_name("report.html") for _ in range(100)}
    tags = [n.split(".")[-2] for n in names]
    assert len(names) == 100 and all(re.fullmatch(r"[0-9a-f]{16}", t) for t in tags)
    assert str(PID) not in tags and f"{PID:x}" not in tags


def test_a_window_folder_planted_as_a_link_receives_nothing(tmp_path: Path, victim: Path) -> None:
    # GIVEN OUT/window-step2 planted as a link to a folder outside OUT (item 12)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    (out / "window-step2").symlink_to(elsewhere)
    before = sorted(elsewhere.iterdir())
    # WHEN a window's trace is exported there
    with pytest.raises(OSError, match="link"):
        export_trace(_FakeProfiler(), str(out / "window-step2"), use_gzip=False, own_folder=True)
    # THEN nothing lands outside OUT
    assert sorted(elsewhere.iterdir()) == before


def test_a_trace_is_exported_through_a_private_folder_and_named_by_its_final_path(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    path, info = export_trace(
        _FakeProfiler(), str(out / "window-step4"), use_gzip=True, own_folder=True
    )
    assert (
        Path(path).parent == out / "window-step4"
        and path.endswith(".pt.trace.json.gz")
        and info.st_size > 0
    )
    # the file written, by inode: what the run's end checks
    assert os.path.samestat(info, os.stat(path))
    # no scratch folder left
    assert [p.name for p in (out / "window-step4").iterdir()] == [Path(path).name]
    import gzip

    assert path in gzip.decompress(Path(path).read_bytes()).decode()  # traceName: the final file


def test_the_agent_writes_into_no_control_folder_but_its_own_private_one(tmp_path: Path) -> None:
    # GIVEN a control folder swapped for one open to others (as another user's would be) (item 7)
    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(0o777)
    # THEN the step log, the whole-run step times and summary.json are refused there
    with pytest.raises(Refused):
        atomic_write_json(str(folder / "h.1.steps.json"), {}, 0o600, private_folder=True)
    with pytest.raises(StepcliError):
        write_run_summary({}, str(folder / "summary.json"), private_folder=True)
    assert list(folder.iterdir()) == []
    if os.getuid() != 0:
        pytest.skip("the other-user half needs root (to give the folder to another user)")
    folder.chmod(0o700)
    os.chown(folder, 65534, 65534)  # nobody's: private, but not ours
    with pytest.raises(Refused, match="another user"):
        atomic_write_json(str(folder / "h.1.steps.json"), {}, 0o600, private_folder=True)


def test_a_fifo_planted_as_a_step_record_never_blocks_the_launcher(tmp_path: Path) -> None:
    # GIVEN a FIFO named like a process's whole-run step times (item 7)
    os.mkfifo(tmp_path / "host.123.steptimes.json")
    # WHEN the launcher reads the step records: it returns at once, without it
    code = (
        "import sys; from stepcli.runfolder.steprecordreader import load; print(load(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_merge_replaces_only_a_file_whose_first_key_is_the_marker(tmp_path: Path) -> None:
    # (item 4) a note that merely mentions the marker is the user's
    notes = tmp_path / "notes.txt"
    notes.write_text('my notes: "stepcli_merged" is the key merge writes first\n')
    with pytest.raises(StepcliError, match="not written by stepcli merge"):
        check_output(str(notes))
    (tmp_path / "late.json").write_text('{"traceEvents": [], "stepcli_merged": {}}')
    with pytest.raises(StepcliError, match="not written by stepcli merge"):
        check_output(str(tmp_path / "late.json"))
    (tmp_path / "ours.json").write_text(' {\n "stepcli_merged" : {}, "traceEvents": []}')
    check_output(str(tmp_path / "ours.json"))
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(StepcliError, match="not a regular file"):
        check_output(str(tmp_path / "fifo.json"))  # never blocks


def test_new_file_keeps_nothing_on_failure_and_never_replaces_with_replace_false(
    tmp_path: Path,
) -> None:
    target = tmp_path / "a.json"
    with pytest.raises(RuntimeError), safefile.NewFile(str(target)) as handle:
        handle.write(b"half")
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []
    target.write_bytes(b"first")
    with pytest.raises(FileExistsError):
        safefile.write_bytes(str(target), b"second", replace=False)
    assert target.read_bytes() == b"first" and list(tmp_path.iterdir()) == [target]


_WRITER_STOPPED = """
import os, sys, time
from stepcli import safefile
from stepcli.quickexit import remove_temps_on_signals
remove_temps_on_signals()
with safefile.NewFile(os.path.join(sys.argv[1], "out.json")) as handle:
    handle.write(b"half")
    handle.flush()
    print("writing", flush=True)
    # still writing: short naps, as a command at work runs bytecode. One long sleep could miss the
    # signal: CPython runs a Python-level handler between bytecodes, and a signal that lands after
    # the last check but before the sleep's system call starts sleeps with it (1 run in ~400 on a
    # busy machine)
    for _ in range(60_000):
        time.sleep(0.01)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_mid_write_removes_the_temporary_file_and_ends_by_that_signal(
    tmp_path: Path, name: str
) -> None:
    # GIVEN a process writing through NewFile, with stepcli's short-command signal handling (issue
    # 47, defect 14)
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER_STOPPED, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    assert [p.name.endswith(".tmp") for p in tmp_path.iterdir()] == [True]
    # WHEN the signal arrives
    proc.send_signal(getattr(signal, name))
    proc.wait(timeout=60)
    # THEN it still ends by that signal, and no temporary file is left
    assert proc.returncode == -getattr(signal, name)
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_removes_none_of_its_parents_temporary_files(tmp_path: Path) -> None:
    with safefile.NewFile(str(tmp_path / "out.json")) as handle:
        handle.write(b"x")
        pid = os.fork()
        if pid == 0:
            safefile.remove_live_temps()
            os._exit(0)
        os.waitpid(pid, 0)
        assert len(list(tmp_path.iterdir())) == 1  # the parent's temporary file is still there
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
