"""Nothing the user had is overwritten, and a folder that fills up or turns read-only mid-run is
said plainly: one line naming the cause, profiling stops in that process, no temporary file is left,
and the summary says what is missing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TRAIN_LOOP, run_stepcli, write_script


def test_run_keeps_the_users_own_report_html(tmp_path: Path, train_script: Path) -> None:
    # GIVEN an output folder holding the user's own report.html
    out = tmp_path / "out"
    out.mkdir()
    mine = "<html><body>my quarterly report</body></html>"
    (out / "report.html").write_text(mine)
    # WHEN stepcli runs into it, twice
    for _ in range(2):
        result = run_stepcli("run", "--active", "1", "-o", out, train_script, "4")
        assert result.returncode == 0, result.stderr
    # THEN the user's page is untouched, and each run's page has a free name of its own, said in one
    # line
    assert (out / "report.html").read_text() == mine
    assert sorted(p.name for p in out.glob("report-*.html")) == ["report-2.html", "report-3.html"]
    assert "report.html in" in result.stderr and "was not written by stepcli" in result.stderr
    assert "report-3.html" in result.stderr  # the summary's next: line points at this run's page
    # (A page stepcli wrote is replaced by the next run, not renamed: test_report.py's reused-folder
    # test checks it.)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 200 KB tmpfs: room for three small traces, then full."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _stepcli_lines(stderr: str) -> list[str]:
    """stepcli's own lines while the program ran (before the summary)."""
    return [
        line
        for line in stderr.split("stepcli summary", 1)[0].splitlines()
        if line.startswith("stepcli:")
    ]


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and ".tmp" in p.name]


def test_json_replaces_only_a_run_summary_written_before(tmp_path: Path) -> None:
    # GIVEN files at the --json path: the script itself, the user's notes, a link to them, a FIFO
    script = tmp_path / "job.py"
    script.write_text("open('started', 'a').close()\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    link = tmp_path / "link.json"
    link.symlink_to(notes)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for target in (script, notes, link, fifo):
        # WHEN stepcli run --json names it THEN one line, exit 2, the program never starts, nothing
        # is replaced
        result = run_stepcli(
            "run", "-o", tmp_path / "out", "--json", target, script, cwd=tmp_path, timeout=60
        )
        assert result.returncode == 2, (target, result.stderr)
        assert (
            result.stderr.startswith(f"stepcli: error: --json {target}: ")
            and "--json FILE" in result.stderr
        )
        assert result.stderr.count("\n") == 1 and not (tmp_path / "started").exists()
    assert (
        script.read_text() == "open('started', 'a').close()\n" and notes.read_text() == "my notes\n"
    )
    assert os.readlink(link) == str(notes) and stat.S_ISFIFO(fifo.lstat().st_mode)
    # GIVEN a run summary written before (the same job run again) THEN it is replaced
    previous = tmp_path / "run.json"
    previous.write_text('{\n  "schema": "stepcli.run",\n  "schema_version": 2, "old": true}')
    result = run_stepcli(
        "run", "-o", tmp_path / "out", "--json", previous, script, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(previous.read_text())["schema"] == "stepcli.run" and "old" not in json.loads(
        previous.read_text()
    )
    # GIVEN a program that writes its own file at the --json path while it runs (the path was free
    # at the start)
    metrics = tmp_path / "metrics.json"
    writer = tmp_path / "writer.py"
    writer.write_text("open('metrics.json', 'w').write('{\"loss\": 1}')\n")
    result = run_stepcli(
        "run", "-o", tmp_path / "out2", "--json", metrics, writer, cwd=tmp_path, timeout=120
    )
    # THEN the program's file stays, and a line says so and where the run summary is
    assert result.returncode == 0, result.stderr
    assert metrics.read_text() == '{"loss": 1}'
    assert (
        f"--json {metrics}: exists and was not written by stepcli (it appeared while the program "
        f"ran)" in result.stderr
    )
    assert f"stepcli compare {tmp_path / 'out2'}" in result.stderr


def test_a_full_output_folder_is_one_line_and_a_summary_that_says_so(
    tiny_fs: Path, tmp_path: Path
) -> None:
    # GIVEN a 300-step program recording 20 windows of ~47 KB into a 200 KB folder
    script = write_script(tmp_path, "train.py", TRAIN_LOOP.replace('print(f"iter {i}")', "pass"))
    # WHEN it runs
    result = run_stepcli(
        "run",
        "--wait",
        "10",
        "--warmup",
        "1",
        "--active",
        "2",
        "--repeat",
        "20",
        "-o",
        tiny_fs,
        script,
        "300",
    )
    # THEN the program's status is kept
    assert result.returncode == 0, result.stderr
    err = result.stderr
    # AND the failure is one line naming the real cause, and profiling stopped after it
    failures = [
        line
        for line in _stepcli_lines(err)
        if "could not" in line and "No space left on device" in line
    ]
    assert len(failures) == 1, err
    assert "profiling stops in this process" in failures[0]
    assert "FileNotFoundError" not in err and "Traceback" not in err
    saved = err.count("saved trace of")
    assert 1 <= saved < 20, err
    assert err.count("profiling steps") == saved + 1, err  # no window opened after the failure
    # AND no temporary file is left behind
    assert _leftovers(tiny_fs) == []
    # AND the summary says what it could not write instead of a silently wrong step count
    summary = " ".join(err.split("stepcli summary", 1)[1].split())
    assert "steps 300 " in summary or "its step log is from step" in summary, summary
    assert "No space left on device" in summary, summary


def test_a_read_only_output_folder_mid_run_stops_profiling_with_one_line(tmp_path: Path) -> None:
    # GIVEN a program that makes its output folder read-only (a remount, here a bind mount) after a
    # few steps
    out = tmp_path / "out"
    out.mkdir()
    source = TRAIN_LOOP.replace(
        'print(f"iter {i}")',
        "if i == 15:\n"
        "                import subprocess\n"
        "                subprocess.run(['mount', '--bind', '-o', 'ro', OUT, OUT], check=True)\n"
        "                subprocess.run(['mount', '-o', 'remount,ro,bind', OUT, OUT], check=True)",
    ).replace("import torch\n", f"import torch\n    OUT = {str(out)!r}\n", 1)
    script = write_script(tmp_path, "train.py", source)
    probe = subprocess.run(["mount", "--bind", str(out), str(out)], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {probe.stderr.strip()}")
    subprocess.run(["umount", str(out)], check=True)
    try:
        # WHEN it runs 300 steps recording 20 windows
        result = run_stepcli(
            "run",
            "--wait",
            "10",
            "--warmup",
            "1",
            "--active",
            "2",
            "--repeat",
            "20",
            "-o",
            out,
            script,
            "300",
        )
    finally:
        while subprocess.run(["umount", str(out)], capture_output=True).returncode == 0:
            pass
    # THEN one line names the cause and profiling stopped; the program's status is kept
    assert result.returncode == 0, result.stderr
    err = result.stderr
    failures = [
        line
        for line in _stepcli_lines(err)
        if "could not" in line and "Read-only file system" in line
    ]
    assert len(failures) == 1, err
    assert "profiling stops in this process" in failures[0]
    assert err.count("could not save") <= 1, err
    assert "Traceback" not in err
    # AND the summary says that the step log is from before the failure, and why
    summary = " ".join(err.split("stepcli summary", 1)[1].split())
    assert (
        "its step log is from step" in summary
        and "could not be written (Read-only file system" in summary
    )
    assert "report.html not written" in summary and "Traceback" not in summary
    assert _leftovers(out) == []
    assert os.access(out, os.W_OK)


def test_a_step_log_that_cannot_be_written_is_named_in_the_summary(tmp_path: Path) -> None:
    # GIVEN a program whose run's step-log folder turns read-only mid-run (the traces' folder stays
    # writable)
    out = tmp_path / "out"
    source = TRAIN_LOOP.replace(
        'print(f"iter {i}")',
        "if i == 40:\n                import json, os, subprocess\n                config = "
        "json.loads(os.environ['STEPCLI_CONFIG'])\n                logs = "
        "os.path.join(config['out_dir'], '.stepcli', config['run_id'])\n                "
        "subprocess.run(['mount', '--bind', logs, logs], check=True)\n                "
        "subprocess.run(['mount', '-o', 'remount,ro,bind', logs, logs], check=True)",
    )
    script = write_script(tmp_path, "train.py", source)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    probe = subprocess.run(
        ["mount", "--bind", str(probe_dir), str(probe_dir)], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {probe.stderr.strip()}")
    subprocess.run(["umount", str(probe_dir)], check=True)
    try:
        # WHEN it runs 300 steps, its one window (steps 2-4) saved long before
        result = run_stepcli("run", "-o", out, script, "300")
    finally:
        for folder in out.glob(".stepcli/*"):
            subprocess.run(["umount", str(folder)], capture_output=True)
    # THEN the program's status is kept, one line names the step log and the cause
    assert result.returncode == 0, result.stderr
    failures = [line for line in _stepcli_lines(result.stderr) if "could not" in line]
    assert len(failures) == 1 and "could not write the step log" in failures[0], result.stderr
    assert "Read-only file system" in failures[0]
    # AND the summary does not pass off the last step log it could write as the whole run
    summary = " ".join(result.stderr.split("stepcli summary", 1)[1].split())
    assert (
        "its step log is from step" in summary
        and "could not be written (Read-only file system" in summary
    )
    assert "steps 300 " not in summary


def _plant_link_of_another_user(
    link: Path, target: Path, monkeypatch: pytest.MonkeyPatch | None = None
) -> None:
    """A link at `link` owned by another user: chowned where the tests run as root, else (in-process
    only) this user is made to look like someone else to stepcli."""
    link.symlink_to(target)
    if os.geteuid() == 0:
        os.lchown(link, 65534, 65534)
    elif monkeypatch is not None:
        from stepcli import safefile

        monkeypatch.setattr(safefile, "uid", lambda: os.getuid() + 1)
    else:
        pytest.skip("planting a link of another user needs root")


@pytest.mark.parametrize("in_process", [True, False])
def test_run_never_follows_a_link_another_user_planted_at_the_output_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process: bool
) -> None:
    # GIVEN a shared folder where another user planted `out` as a link to a folder of theirs (issue
    # 47, defect 15)
    shared, theirs = tmp_path / "shared", tmp_path / "theirs"
    shared.mkdir(mode=0o777)
    theirs.mkdir()
    _plant_link_of_another_user(shared / "out", theirs, monkeypatch if in_process else None)
    # WHEN a run is asked to write to SHARED/out
    if in_process:
        from stepcli.errors import StepcliError
        from stepcli.run.outputs import prepare_out_dir

        with pytest.raises(StepcliError) as refused:
            prepare_out_dir(str(shared / "out"), "x")
        message = refused.value.message
    else:
        script = write_script(tmp_path, "ran.py", "open('ran', 'w').write('ran')\n")
        proc = run_stepcli("run", "-o", shared / "out", script, cwd=tmp_path)
        # THEN it is one line and exit 2, before the program runs
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "ran").exists()
        message = proc.stderr
    # THEN the link is named as another user's and not followed: nothing is written where it points
    assert "is a link of another user" in message and "not followed" in message, message
    assert list(theirs.iterdir()) == []


def test_run_follows_a_link_of_this_user_at_the_output_folder(tmp_path: Path) -> None:
    # GIVEN `out` as this user's own link to a scratch folder
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "out").symlink_to(scratch)
    from stepcli.run.outputs import prepare_out_dir

    # WHEN the output folder is prepared THEN it is the folder the link names, as before
    assert prepare_out_dir(str(tmp_path / "out"), "x") == scratch.resolve()


def test_a_json_that_cannot_be_written_leaves_no_stale_summary_and_fails_the_run(
    tiny_fs: Path, tmp_path: Path
) -> None:
    # GIVEN the previous run's summary at the --json path, on a disk the program fills while it runs
    # (issue 47, 9)
    stale = tiny_fs / "run.json"
    stale.write_text(
        json.dumps({"schema": "stepcli.run", "version": 2, "exit_status": 0, "notes": ["old run"]})
    )
    script = write_script(
        tmp_path,
        "fills.py",
        f"""
        try:
            with open({str(tiny_fs / "filler")!r}, "wb") as filler:
                filler.write(bytes(1 << 20))
        except OSError:
            pass
        """,
    )
    # WHEN the run ends and cannot write its summary there
    proc = run_stepcli("run", "-o", tmp_path / "out", "--json", stale, script)
    # THEN the old summary is gone (never judged as this run), one line says so, and the run fails
    # with 74 stepcli.errors.EXIT_NOT_SAVED, docs/reference/exit-codes.md
    assert proc.returncode == 74, proc.stderr
    assert not stale.exists()
    (line,) = [line for line in proc.stderr.splitlines() if f"--json {stale}" in line]
    assert (
        "No space left on device" in line and "the previous run's summary there was removed" in line
    ), line
    assert "Traceback" not in proc.stderr


def test_drop_stale_json_removes_only_a_run_summary(tmp_path: Path) -> None:
    from stepcli.run.outputs import drop_stale_json

    # GIVEN a previous run's summary, the user's own file and a link at --json paths
    summary, mine, link = tmp_path / "run.json", tmp_path / "mine.json", tmp_path / "link.json"
    summary.write_text('{"schema": "stepcli.run"}')
    mine.write_text('{"mine": 1}')
    link.symlink_to(summary)
    # WHEN each could not be written over THEN only the run summary is removed
    assert "was removed" in drop_stale_json(str(summary)) and not summary.exists()
    assert "left as it is" in drop_stale_json(str(mine)) and mine.exists()
    assert "left as it is" in drop_stale_json(str(link)) and link.is_symlink()
    assert drop_stale_json(str(tmp_path / "none.json")) == "no run summary is there"
