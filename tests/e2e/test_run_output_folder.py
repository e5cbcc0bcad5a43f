"""The output folder is not an attack surface: forged step logs and outside traces are refused, the
control folder is private whatever the umask, a failing summary still leaves `--json` and a non-zero
exit, and SIGKILL of stepcli takes the program's whole process group down."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_stepcli, stepcli_env, trace_files, write_script

DATA = Path(__file__).resolve().parent.parent / "data"

# Files appear in the run's control folder while the program trains: a made-up worker with 99 steps
# and a window on a trace outside the output folder (unsigned, as anything outside the run writes
# it), a JSON list, and an entry without `worker` (signed with the run's key, so the schema check is
# what refuses it). Only the agent's log counts.
_FORGER = """
    import json, os, sys
    import torch
    sys.path.insert(0, {repo!r})
    from stepcli.agent.signing import sign

    config = json.loads(os.environ["STEPCLI_CONFIG"])
    folder = os.path.join(config["out_dir"], ".stepcli", config["run_id"])
    outside = sys.argv[1]
    forged = {{"schema_version": 1, "worker": "rank9", "rank": 9, "pid": 4242, "host": "evil", "argv": [],
              "python": "3", "torch": "x", "started_at": 0.0, "global_steps": 99,
              "requesters": [{{"name": "Evil#0", "calls": 99, "first_step": 0}}], "durations_us": [1000] * 99,
              "phases": "0" * 99, "windows": [{{"first_step": 1, "last_step": 2, "trace": outside,
              "bytes": os.path.getsize(outside), "complete": True}}], "skipped_windows": 0, "notes": [],
              "exit": "exit", "peak_rss_bytes": 1, "cuda_peak_bytes": None}}
    with open(os.path.join(folder, "evil.1.steps.json"), "w") as f:
        json.dump(forged, f)
    with open(os.path.join(folder, "list.2.steps.json"), "w") as f:
        json.dump([], f)
    nameless = dict(forged, worker=None)
    nameless["signature"] = sign(config["run_key"], {{k: v for k, v in nameless.items()}})
    with open(os.path.join(folder, "nameless.3.steps.json"), "w") as f:
        json.dump(nameless, f)

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
"""  # noqa: E501


@pytest.fixture(scope="module")
def forged_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of _FORGER, under umask 000, into an output folder whose .stepcli/ an earlier run
    left world-writable."""
    base = tmp_path_factory.mktemp("forged")
    # a trace outside the output folder with an operator name of its own
    outside = base / "elsewhere" / "rank9.1.pt.trace.json"
    outside.parent.mkdir()
    outside.write_text(
        (DATA / "train_cpu.pt.trace.json").read_text().replace("aten::addmm", "evil::op")
    )
    script = write_script(base, "forger.py", _FORGER.format(repo=str(REPO)))
    out = base / "out"
    (out / ".stepcli").mkdir(parents=True)
    os.chmod(out / ".stepcli", 0o777)
    previous = os.umask(0)  # the child inherits it
    try:
        proc = run_stepcli(
            "run",
            "-o",
            out,
            "--json",
            out / "s.json",
            "--wait",
            "0",
            "--warmup",
            "0",
            "--active",
            "2",
            script,
            outside,
        )
    finally:
        os.umask(previous)
    return {"out": out, "proc": proc}


def test_forged_step_logs_and_outside_traces_are_refused(forged_run: dict[str, Any]) -> None:
    # GIVEN a trace outside the output folder with an operator name of its own
    # WHEN the program forges step logs in the control folder during its run
    proc, out = forged_run["proc"], forged_run["out"]
    # THEN the run and its summary are the program's own, and one note names what was refused
    assert proc.returncode == 0, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    summary = json.loads((out / "s.json").read_text())
    assert summary["steps"]["global"] == 6 and set(summary["steps"]["requesters"]) == {"SGD#0"}
    assert [p["global_steps"] for p in summary["processes"]] == [6]
    assert summary["traces"] and all(Path(t).parent == out for t in summary["traces"])
    assert not any(op["name"] == "evil::op" for op in summary["top_operators"])
    refused = [n for n in summary["notes"] if n.startswith("ignored")]
    assert len(refused) == 1, summary["notes"]
    assert "ignored 3 file(s)" in refused[0]
    for words in (
        "evil.1.steps.json (not signed",
        "list.2.steps.json (not a JSON object",
        "nameless.3.steps.json (worker",
    ):
        assert words in refused[0], refused[0]
    assert sum("ignored 3 file(s)" in line for line in proc.stderr.splitlines()) == 1


def test_only_traces_this_run_wrote_inside_the_output_folder_count(tmp_path: Path) -> None:
    from stepcli.agent.config import AgentConfig
    from stepcli.agent.signing import sign
    from stepcli.runfolder.steplogreader import load_step_logs, trace_problem

    # GIVEN a signed step log whose windows name a good trace, one outside the output folder, a link
    # inside the folder that points outside, a trace whose size is not what the agent recorded, and
    # one older than the run
    out = tmp_path / "out"
    config = AgentConfig(run_id="r1", out_dir=str(out), launcher_pid=1, run_key="k" * 32)
    Path(config.log_dir).mkdir(parents=True)
    started = time.time()
    good = out / "rank0.1.pt.trace.json"
    good.write_text("{}")
    outside = tmp_path / "outside.pt.trace.json"
    outside.write_text("{}")
    link = out / "rank0.2.pt.trace.json"
    link.symlink_to(outside)
    resized = out / "rank0.3.pt.trace.json"
    resized.write_text("{ }")
    old = out / "rank0.4.pt.trace.json"
    old.write_text("{}")
    os.utime(old, (started - 3600, started - 3600))
    # and one swapped for a same-size forgery with the written file's mtime (another inode: issue
    # 47, defect 5)
    swapped = out / "rank0.5.pt.trace.json"
    swapped.write_text("{}")
    written = os.stat(swapped)
    forgery = out / "forgery"
    forgery.write_text("[]")
    os.utime(forgery, ns=(written.st_atime_ns, written.st_mtime_ns))
    os.replace(forgery, swapped)
    recorded = {p: os.stat(p) for p in (good, resized, old)} | {
        outside: os.stat(outside),
        swapped: written,
    }
    recorded[link] = recorded[outside]

    def window(path: Path) -> dict[str, Any]:
        info = recorded[path]
        return {
            "first_step": 1,
            "last_step": 1,
            "bytes": 2,
            "complete": True,
            "trace": str(path),
            "inode": info.st_ino,
            "device": info.st_dev,
        }  # as the agent records the file it wrote

    log: dict[str, Any] = {
        "schema_version": 1,
        "worker": "rank0",
        "rank": 0,
        "pid": 7,
        "host": "h",
        "argv": ["t.py"],
        "python": "3",
        "torch": "2",
        "started_at": started,
        "global_steps": 3,
        "requesters": [{"name": "SGD#0", "calls": 3, "first_step": 0}],
        "durations_us": [5, 6, 7],
        "phases": "013",
        "skipped_windows": 0,
        "notes": [],
        "exit": "exit",
        "peak_rss_bytes": None,
        "cuda_peak_bytes": None,
        "windows": [window(p) for p in (good, outside, link, resized, old, swapped)],
    }
    log["signature"] = sign(config.run_key, log)
    (Path(config.log_dir) / "h.7.steps.json").write_text(json.dumps(log))
    # WHEN the launcher loads the run's step logs
    logs, notes = load_step_logs(config, since=started)
    note = notes[0]
    # THEN the log counts with only the good trace, and one note names the five refused
    assert [w["trace"] for w in logs[0]["windows"]] == [str(good)]
    assert set(logs[0]["windows"][0]) == {"first_step", "last_step", "bytes", "complete", "trace"}
    assert note is not None and note.startswith("ignored 5 file(s)")
    assert (
        f"{outside} (outside the output folder)" in note
        and f"{link} (outside the output folder)" in note
    )
    assert "+2 more" in note  # at most three named, so the note stays one readable line
    assert (
        trace_problem(window(swapped), str(out), started)
        == "not the file the agent wrote (replaced since)"
    )
    # a step log of another node: its device number is that node's mount of a shared file system,
    # its inode counts
    elsewhere = dict(window(good), device=recorded[good].st_dev + 1)
    assert trace_problem(elsewhere, str(out), started, same_host=False) is None
    assert (
        trace_problem(elsewhere, str(out), started)
        == "not the file the agent wrote (replaced since)"
    )
    assert trace_problem(window(swapped), str(out), started, same_host=False) is not None
    # and a log signed with another key is refused whole
    other = AgentConfig(run_id="r1", out_dir=str(out), launcher_pid=1, run_key="x" * 32)
    logs, notes = load_step_logs(other, since=started)
    note = notes[0]
    assert logs == [] and note is not None and "not signed by this run's processes" in note


def test_a_failing_summary_keeps_the_json_file_and_a_nonzero_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stepcli.agent.config import AgentConfig
    from stepcli.agent.schedule import Schedule
    from stepcli.cli import main
    from stepcli.run import launcher
    from stepcli.run.summary import build as runreport

    # GIVEN a run whose summary building raises (a bug), after a program that succeeded
    def broken(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
        raise KeyError("first_step")

    monkeypatch.setattr(runreport, "build_run_summary", broken)
    target = tmp_path / "ci" / "current.json"
    request = launcher.RunRequest(
        argv=[sys.executable, "x.py"], label="x", schedule=Schedule(), json_path=str(target)
    )
    config = AgentConfig(run_id="r", out_dir=str(tmp_path), launcher_pid=os.getpid())
    # WHEN stepcli reports the run
    status = launcher._report(request, config, 0, time.time(), 1.0)
    # THEN it fails visibly (70), says so in one line, and --json exists for the compare that
    # follows
    assert status == 70
    err = capsys.readouterr().err
    assert "internal error while summarizing the run (KeyError: 'first_step')" in err
    document = json.loads(target.read_text())
    assert document["schema"] == "stepcli.run" and "KeyError" in document["notes"][0]
    assert main(["compare", str(target), str(target)]) == 3  # nothing measured: never a pass
    # and a program that failed keeps its own status
    assert launcher._report(request, config, 5, time.time(), 1.0) == 5


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_control_folder_is_private_whatever_the_umask(forged_run: dict[str, Any]) -> None:
    # GIVEN umask 000 and an output folder whose .stepcli/ an earlier run left world-writable WHEN
    # stepcli runs
    proc, out = forged_run["proc"], forged_run["out"]
    assert proc.returncode == 0, proc.stderr
    # THEN the control folder and this run's folder in it are 0700; traces and the summary follow
    # the umask
    control = out / ".stepcli"
    runs = list(control.iterdir())
    assert len(runs) == 1
    assert _mode(control) == 0o700 and _mode(runs[0]) == 0o700
    assert trace_files(out) and all(_mode(t) == 0o666 for t in trace_files(out))
    assert _mode(out / "s.json") == 0o666


def test_control_folder_owned_by_a_link_is_refused(tmp_path: Path, train_script: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "theirs").mkdir()
    (out / ".stepcli").symlink_to(tmp_path / "theirs")
    proc = run_stepcli("run", "-o", out, train_script)
    assert proc.returncode == 2 and "refusing to use it" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not list((tmp_path / "theirs").iterdir())


_WITH_CHILD = """
    import subprocess, sys, time
    import torch
    child = subprocess.Popen(["sleep", "300"])
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(100000):
        opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
        if i == 3:
            with open(sys.argv[1], "w") as f:
                f.write(str(child.pid))
        time.sleep(0.01)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux"
)
def test_sigkill_of_stepcli_takes_the_programs_group_down(tmp_path: Path) -> None:
    # GIVEN a program with a window open and a child of its own (`sleep 300`), run outside a
    # terminal
    script = write_script(tmp_path, "with_child.py", _WITH_CHILD)
    pid_file = tmp_path / "child.pid"
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepcli",
            "run",
            "-o",
            str(out),
            "--wait",
            "0",
            "--warmup",
            "0",
            "--active",
            "100000",
            str(script),
            str(pid_file),
        ],
        env=stepcli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    sleeper = 0
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        sleeper = int(pid_file.read_text())
        assert _running(sleeper)
        # WHEN stepcli itself is killed with SIGKILL
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # THEN the program saves its trace and its own child does not survive
        deadline = time.monotonic() + 60
        while _running(sleeper) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(sleeper), "the program's child outlived stepcli"
        deadline = time.monotonic() + 30
        while not trace_files(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert trace_files(out), "the program did not save its open window"
    finally:
        if sleeper and _running(sleeper):
            os.kill(sleeper, signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# The program plays another user who swaps its saved trace for a forgery of the same size and mtime
# (a new file renamed over it, so another inode): the run's end must not present the forgery's
# operator as the run's.
_SWAPPER = """
    import json, os
    import torch

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(8):
        opt.zero_grad(); model(torch.randn(32, 16)).sum().backward(); opt.step()
    out = json.loads(os.environ["STEPCLI_CONFIG"])["out_dir"]
    [name] = [n for n in os.listdir(out) if n.endswith(".pt.trace.json")]
    path = os.path.join(out, name)
    data, info = open(path, "rb").read(), os.stat(path)
    assert b"aten::addmm" in data
    with open(path + ".forged", "wb") as forged:
        forged.write(data.replace(b"aten::addmm", b"EVIL::addmm"))
    os.utime(path + ".forged", ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(path + ".forged", path)
"""


def test_a_trace_swapped_for_a_same_size_forgery_is_not_presented(tmp_path: Path) -> None:
    # GIVEN a program whose trace is replaced by a same-size, same-mtime forgery after it was saved
    # (issue 47, 5)
    script = write_script(tmp_path, "swap.py", _SWAPPER)
    out = tmp_path / "out"
    # WHEN it runs under stepcli
    proc = run_stepcli("run", "-o", out, "--json", tmp_path / "s.json", script)
    # THEN the forgery's contents appear nowhere, and one note says the trace was not the file the
    # agent wrote
    assert proc.returncode == 0, proc.stderr
    assert "EVIL" not in proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert "EVIL" not in json.dumps(summary["top_operators"]) and summary["windows"] == []
    assert any("not the file the agent wrote" in note for note in summary["notes"]), summary[
        "notes"
    ]
    for page in out.rglob("*.html"):
        assert "EVIL" not in page.read_text()


_TRAINER = """
    import torch

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(26):
        opt.zero_grad(); model(torch.randn(32, 16)).sum().backward(); opt.step()
"""


def _run_folder(tmp: Path, name: str) -> Path:
    """A run folder of 22 recorded steps: enough for compare to attribute a change to operators."""
    out = tmp / name
    proc = run_stepcli("run", "-o", out, "--active", "22", write_script(tmp, "train.py", _TRAINER))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def forged_run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose listed trace another user swapped, after the run, for a same-size,
    same-mtime forgery (another inode) naming `EVIL::addmm`."""
    tmp = tmp_path_factory.mktemp("forged")
    out = _run_folder(tmp, "out")
    [path] = trace_files(out)
    data, info = path.read_bytes(), os.stat(path)
    assert b"aten::addmm" in data
    forged = out / "forged"
    forged.write_bytes(data.replace(b"aten::addmm", b"EVIL::addmm"))
    os.utime(forged, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(forged, path)
    return out


def test_report_of_a_run_folder_reads_no_trace_swapped_after_the_run(
    forged_run_folder: Path, tmp_path: Path
) -> None:
    # GIVEN a run folder whose trace was swapped for a forgery after the run (issue 47)
    # WHEN it is reported on
    page = tmp_path / "r.html"
    proc = run_stepcli("report", forged_run_folder, "-o", page)
    # THEN the page holds nothing of the forgery, and one note says why the trace was left out
    assert proc.returncode == 0, proc.stderr
    assert "EVIL" not in page.read_text() and "EVIL" not in proc.stdout + proc.stderr
    assert "not the file the agent wrote (replaced since)" in proc.stderr
    assert (
        sum(line.startswith("stepcli: note: left out 1 trace") for line in proc.stderr.splitlines())
        == 1
    )


def test_compare_of_a_run_folder_reads_no_trace_swapped_after_the_run(
    forged_run_folder: Path, tmp_path: Path
) -> None:
    # GIVEN the same run folder, and a baseline run of the same program (before this fix, compare
    # attributed the change to the forgery's `EVIL::addmm`, an operator the baseline never ran)
    baseline = _run_folder(tmp_path, "baseline")
    # WHEN the forged run is compared with it (attribution reads the traces each summary lists)
    proc = run_stepcli("compare", baseline, forged_run_folder, "--allow-inconclusive")
    # THEN nothing of the forgery is judged or shown, and the trace is named as left out (the
    # verdict itself is the two runs' step times: on a busy machine one may be slower, a regression,
    # exit 1)
    assert proc.returncode in (0, 1), proc.stderr
    assert "EVIL" not in proc.stdout + proc.stderr
    assert "not the file the agent wrote (replaced since)" in proc.stderr
