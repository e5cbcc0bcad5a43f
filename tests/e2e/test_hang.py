"""The hang doctor: `stepcli run --hang-timeout/--on-hang` and `stepcli capture --stacks`, on real
processes (gloo)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import artifacts_dir
from conftest import (
    TRAIN_LOOP,
    load_trace,
    profiler_steps,
    run_stepcli,
    stepcli_env,
    trace_files,
    write_script,
)

from stepcli.errors import EXIT_HANG

# Rank 1 blocks forever in `stuck_forever` before the all-reduce of step 5 (after the default
# window, steps 2-4, was saved) and writes the time it did so; rank 0 enters that all-reduce. gloo's
# own timeout (600 s) never fires.
HANG = """
    import datetime
    import sys
    import threading
    import time
    from pathlib import Path
    import torch
    import torch.distributed as dist

    def stuck_forever(marker):
        marker.write_text(repr(time.time()))
        threading.Event().wait()

    def main():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
        rank = dist.get_rank()
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(8):
            model(torch.randn(4, 8)).sum().backward()
            if step == 5 and rank == 1:
                stuck_forever(Path(sys.argv[1]))
            dist.all_reduce(torch.ones(1))
            opt.step()
        dist.destroy_process_group()

    main()
"""

# Steps three times, says so in a file, then sleeps (blocked in C) in `napping` until killed.
NAP = """
    import sys
    import time
    from pathlib import Path
    import torch

    def napping():
        time.sleep(600)

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    Path(sys.argv[1]).write_text("stepped")
    napping()
"""

# The same, but then spins in the regular-expression engine, C code that holds the GIL: no Python
# thread runs.
SPIN = NAP.replace("time.sleep(600)", 're.match(r"(a+)+$", "a" * 60 + "b")').replace(
    "import sys", "import re, sys"
)

# Rank 1 spins in the regular-expression engine (C code holding the GIL) before the all-reduce of
# step 5.
HANG_HOLDING_THE_GIL = HANG.replace(
    "threading.Event().wait()", 're.match(r"(a+)+$", "a" * 60 + "b")'
).replace("import datetime", "import datetime, re")

# The line of hang.py (HANG as written) where rank 1 blocks: the frame the summary and the report
# name.
STUCK_LINE = textwrap.dedent(HANG).lstrip().splitlines().index("    threading.Event().wait()") + 1
LIMIT_S = 180.0  # a generous upper bound for anything to appear on a busy 2-core machine


def _torchrun() -> str:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    return torchrun


def _start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "stepcli", *args],
            cwd=cwd,
            env=stepcli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _wait_until(condition: Any, proc: subprocess.Popen[bytes] | None, log: Path, what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the run ended (exit {proc.returncode}) before {what}:\n{log.read_text()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {LIMIT_S} s:\n{log.read_text()}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _dumps(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        path.name.split(".")[0]: json.loads(path.read_text())
        for path in sorted(folder.glob("*.json"))
    }


def _functions(dump: dict[str, Any]) -> list[str]:
    main = next(t for t in dump["threads"] if t["main"])
    return [frame["function"] for frame in main["frames"]]


def _block(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("stepcli:")]


@pytest.fixture
def hung_job(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path, Path]]:
    """A 2-rank job under `stepcli run --hang-timeout 10s` (keep) whose rank 1 hangs; killed at the
    end."""
    script = write_script(tmp_path, "hang.py", HANG)
    marker, log, out = tmp_path / "stuck_at", tmp_path / "log", tmp_path / "out"
    args = [
        "run",
        "--hang-timeout",
        "10s",
        "-o",
        out,
        "--",
        _torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    proc = _start([*map(str, args), str(script), str(marker)], tmp_path, log)
    try:
        yield proc, marker, log, out
    finally:
        _stop(proc)


def test_a_hang_is_dumped_naming_the_blocked_rank_and_the_collective_the_other_waits_in(
    hung_job: tuple[subprocess.Popen[bytes], Path, Path, Path],
) -> None:
    proc, marker, log, out = hung_job
    _wait_until(
        lambda: len(list(out.glob("hang-1/*.json"))) == 2, proc, log, "hang dump of both ranks"
    )
    dumps = _dumps(out / "hang-1")
    stuck_at = float(marker.read_text())
    written = max(p.stat().st_mtime for p in (out / "hang-1").glob("*.json"))
    # timeout 10 s (from its last step): within 20 s
    assert 9.0 <= written - stuck_at <= 20.0, written - stuck_at
    assert set(dumps) == {"rank0", "rank1"}
    # written by its own thread, not the fallback
    assert "source" not in dumps["rank1"], log.read_text()
    # stack frames and argv: private to the user whatever the umask (issue 30, item 17)
    assert {p.stat().st_mode & 0o777 for p in (out / "hang-1").glob("*.json")} == {0o600}
    assert "stuck_forever" in _functions(dumps["rank1"])  # blocked in C (a lock's wait), yet dumped
    assert "stuck_forever" in dumps["rank1"]["faulthandler"]
    assert dumps["rank1"]["collective"] == {
        **dumps["rank1"]["collective"],
        "name": "all_reduce",
        "seq": 5,
    }
    assert dumps["rank1"]["collective"]["returned"] is True
    assert (
        dumps["rank0"]["collective"]["name"] == "all_reduce"
        and dumps["rank0"]["collective"]["seq"] == 6
    )
    assert dumps["rank0"]["collective"]["returned"] is False
    assert all(d["step"] == 5 for d in dumps.values())
    _wait_until(
        lambda: any("holds the job back" in line for line in _block(log)),
        proc,
        log,
        "the hang block",
    )
    block = _block(log)
    waiting = next(line for line in block if "rank 0" in line and "waits in" in line)
    assert "waits in all_reduce #6" in waiting
    verdict = next(line for line in block if "holds the job back" in line)
    assert "rank 1" in verdict and "stuck_forever" in verdict and "all_reduce #6" in verdict
    # --on-hang keep (the default): the job keeps running and is reported again while it stays hung
    _wait_until(
        lambda: len(list(out.glob("hang-2/*.json"))) == 2, proc, log, "the second hang dump"
    )
    assert proc.poll() is None
    assert _dumps(out / "hang-1") == dumps  # the first dump is kept as it was


@pytest.fixture(scope="module")
def killed_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-rank job under `--hang-timeout 10s --on-hang kill` whose rank 1 hangs: its result,
    folders and the run summary, shared by the tests that read what it left (one torchrun run for
    all of them)."""
    tmp_path = tmp_path_factory.mktemp("killed")
    script = write_script(tmp_path, "hang.py", HANG)
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--hang-timeout",
        "10s",
        "--on-hang",
        "kill",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        "--",
        _torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        tmp_path / "stuck_at",
        cwd=tmp_path,
        timeout=LIMIT_S + 60,
    )
    summary = (
        json.loads((tmp_path / "run.json").read_text())
        if (tmp_path / "run.json").exists()
        else None
    )
    return {"result": result, "out": out, "summary": summary}


def test_on_hang_kill_ends_the_job_with_its_status_and_the_saved_traces_stay_intact(
    killed_job: dict[str, Any],
) -> None:
    result, out = killed_job["result"], killed_job["out"]
    assert result.returncode == EXIT_HANG == 124, result.stderr
    assert f"--on-hang kill: ending the job (exit status {EXIT_HANG})" in result.stderr
    dumps = _dumps(out / "hang-1")
    assert set(dumps) == {"rank0", "rank1"} and "stuck_forever" in _functions(dumps["rank1"])
    traces = trace_files(out)
    assert sorted(t.name.split(".")[0] for t in traces) == ["rank0", "rank1"]
    for trace in traces:
        assert load_trace(trace)["traceEvents"]  # valid JSON
        assert profiler_steps(trace) == [2, 3, 4]
    assert not list(out.glob("hang-2"))  # killed after the first dump
    summary = killed_job["summary"]
    assert summary["exit_status"] == EXIT_HANG
    (report,) = summary["hang"]["reports"]
    assert report["folder"] == str(out / "hang-1")
    assert [(p["rank"], p["waiting"]) for p in report["processes"]] == [(0, True), (1, False)]
    assert (
        report["processes"][0]["collective"]["name"] == "all_reduce"
        and report["processes"][0]["collective"]["seq"] == 6
    )
    assert report["processes"][1]["where"].startswith("stuck_forever (")
    # the program's frame, not stepcli's wrapper
    assert report["processes"][0]["where"].startswith("main (")
    assert "rank 1" in report["verdict"] and "holds the job back" in report["verdict"]
    assert 10.0 <= report["idle_s"] <= 30.0
    assert {k: summary["hang"][k] for k in ("timeout_s", "on_hang", "ended_job")} == {
        "timeout_s": 10.0,
        "on_hang": "kill",
        "ended_job": True,
    }


def test_the_run_summary_on_the_terminal_says_where_the_job_hung_and_that_it_was_ended(
    killed_job: dict[str, Any],
) -> None:
    lines = killed_job["result"].stderr.splitlines()
    start = lines.index("stepcli summary")
    status = next(i for i in range(start, len(lines)) if lines[i].startswith("status "))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("hang: "))
    assert re.fullmatch(
        r"hang: at step 5, no process completed a step for \d+\.\d s", lines[first]
    ), lines[first]
    block = lines[first : first + 5]
    assert block[1:] == [
        f"  rank 1 holds the job back: in stuck_forever (hang.py:{STUCK_LINE}), not in a "
        f"collective",
        "  rank 0 waits in all_reduce #6",
        "  stacks of every process: out/hang-1/",
        "  --on-hang kill ended the job: exit status 124",
    ], block
    assert status < first < lines.index("next:")  # under the outcome it explains
    assert lines[first + 5].startswith("trace ")  # and nothing more
    # a pipe: no trailing spaces
    assert all(len(line) <= 80 and line == line.rstrip() for line in block)


# Rank 1 joins the job, then blocks (loading its data, say) before it builds its optimizer: it never
# trains. Rank 0 trains and waits for it in the first all-reduce.
STUCK_BEFORE_TRAINING = """
    import datetime
    import threading
    import torch
    import torch.distributed as dist

    def load_data_forever():
        threading.Event().wait()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    model = torch.nn.Linear(8, 1)
    if dist.get_rank() == 1:
        load_data_forever()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        model(torch.randn(4, 8)).sum().backward()
        dist.all_reduce(torch.ones(1))
        opt.step()
"""


def test_a_rank_stuck_before_its_first_step_is_in_the_dump_and_named(tmp_path: Path) -> None:
    # GIVEN a 2-rank job whose rank 1 never starts to train, under --hang-timeout 3s --on-hang kill
    script = write_script(tmp_path, "stuck.py", STUCK_BEFORE_TRAINING)
    args = ["--hang-timeout", "3s", "--on-hang", "kill", "-o", "out", "--json", "run.json", "--"]
    result = run_stepcli(
        "run",
        *args,
        _torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        cwd=tmp_path,
        timeout=LIMIT_S,
    )
    # THEN the hang is called on rank 0 alone, and both ranks are dumped: rank 1 registered when it
    # joined the job
    assert result.returncode == EXIT_HANG, result.stderr
    out = tmp_path / "out"
    dumps = _dumps(out / "hang-1")
    assert set(dumps) == {"rank0", "rank1"}, result.stderr
    assert "load_data_forever" in _functions(dumps["rank1"]) and dumps["rank1"]["training"] is False
    assert (
        dumps["rank0"]["training"] is True and dumps["rank0"]["collective"]["name"] == "all_reduce"
    )
    # AND the verdict names rank 1 where it is stuck, not "a peer outside this dump"
    assert re.search(
        r"-> rank 1 \(pid \d+\) is in load_data_forever \(\S*stuck\.py:\d+\) while 1 process waits "
        r"in all_reduce #1: it holds the job back",
        result.stderr,
    ), result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["steps"]["global"] == 0 and summary["hang"]["ended_job"] is True
    # AND the note says the job hung before the first window (no advice to lower --wait), the page
    # shows the hang
    assert (
        "no trace: the job hung at step 0, before the first window (steps 2-4), and --on-hang kill "
        "ended it" in (" ".join(summary["notes"]))
    )
    assert not any("lower --wait" in note for note in summary["notes"])
    # AND rank 0, stalled at step 0, saved its final step log at the SIGTERM, as a process with
    # steps does
    assert not any("never written" in note for note in summary["notes"]), summary["notes"]
    page = (out / "report.html").read_text()
    assert "load_data_forever" in _hang_section(page)
    assert not (out / "NOTHING-MEASURED.txt").exists()


def _hang_section(page: str) -> str:
    start = page.index('<h2 id="hang">Hang</h2>')
    return page[start : page.index("<h2", start + 1)]


def test_report_html_has_a_hang_section_verdict_first(killed_job: dict[str, Any]) -> None:
    page = (killed_job["out"] / "report.html").read_text()
    section = _hang_section(page)
    # the first thing after the figures
    assert page.index('<h2 id="hang">') < page.index('<h2 id="advice">')
    verdict = re.search(r'id="hang-verdict-1"><b>(.*?)</b>(.*?)</div>', section)
    assert verdict is not None and section.index("hang-verdict-1") < section.index("<table")
    assert re.fullmatch(
        rf"rank 1 \(pid \d+\) is in stuck_forever \(.*/hang\.py:{STUCK_LINE}\) while 1 process "
        rf"waits in "
        r"all_reduce #6: it holds the job back",
        verdict.group(1),
    ), verdict.group(1)
    said = re.sub(r"<[^>]+>", "", verdict.group(2))
    assert re.fullmatch(
        r"The hang was called at step 5: no process completed a step for \d+\.\d s "
        r"\(--hang-timeout 10 s\)\. stepcli ended the job after the dump \(--on-hang kill, exit "
        r"status 124\)\.",
        said,
    ), said
    assert '<a href="hang-1/"><code>' in section
    rows = [
        (kind, [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", cells)])
        for kind, cells in re.findall(r'<tr class="(\w+)">(.*?)</tr>', section)
    ]
    # process, pid, host, step, waiting, collective, where
    assert [(kind, cells[0], cells[3], cells[4]) for kind, cells in rows] == [
        ("waiting", "rank 0", "5", "waits in a collective"),
        ("elsewhere", "rank 1", "5", "not in a collective"),
    ]
    assert re.fullmatch(r"all_reduce #6 entered \d+\.\d s before the dump", rows[0][1][5])
    assert rows[1][1][5] == "all_reduce #5 returned"
    assert re.fullmatch(r"main \(.*/hang\.py:\d+\)", rows[0][1][6])
    assert re.fullmatch(rf"stuck_forever \(.*/hang\.py:{STUCK_LINE}\)", rows[1][1][6])


def test_the_hang_section_is_visible_in_a_browser(
    killed_job: dict[str, Any], browser: Any, tmp_path: Path
) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    browser.get_log("browser")
    browser.get((killed_job["out"] / "report.html").resolve().as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    section = browser.find_element(By.ID, "hang")
    verdict = browser.find_element(By.ID, "hang-verdict-1")
    table = browser.find_element(By.ID, "hang-processes-1")
    assert section.is_displayed() and verdict.is_displayed() and table.is_displayed()
    assert "holds the job back" in verdict.text and "stuck_forever" in verdict.text
    assert "stepcli ended the job after the dump" in verdict.text
    # on screen without scrolling (the page opens on the figures, then the hang), the table within
    # the page's width
    top = browser.execute_script("return arguments[0].getBoundingClientRect().top", section)
    assert 0 < top < browser.execute_script("return window.innerHeight"), top
    width = browser.execute_script(
        "return [arguments[0].scrollWidth, document.body.clientWidth]", table
    )
    assert width[0] <= width[1], width
    shot = artifacts_dir(tmp_path) / "report-hang.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000


def test_a_healthy_run_with_a_hang_timeout_prints_nothing_extra(tmp_path: Path) -> None:
    """The run lasts longer than the timeout (60 steps of at least 0.1 s), its steps a small
    fraction of it."""
    script = write_script(
        tmp_path, "train.py", TRAIN_LOOP.replace("opt.step()", "opt.step(); time.sleep(0.1)")
    )
    script.write_text("import time\n" + script.read_text())
    watched = run_stepcli(
        "run",
        "--hang-timeout",
        "5s",
        "-o",
        tmp_path / "watched",
        "--json",
        tmp_path / "run.json",
        script,
        "60",
        cwd=tmp_path,
    )
    assert watched.returncode == 0, watched.stderr
    # the program's own output, untouched
    assert watched.stdout == "".join(f"iter {i}\n" for i in range(60))
    said = [line for line in watched.stderr.splitlines() if line.startswith("stepcli:")]
    extra = [
        line
        for line in said
        if any(word in line for word in ("hang:", "stacks", "waits in", "frames", "->"))
    ]
    assert not extra and said[0].startswith("stepcli: recording steps 2-4"), said
    assert not list((tmp_path / "watched").glob("hang-*"))
    assert json.loads((tmp_path / "run.json").read_text())["hang"] is None
    # no block in the summary
    assert not any(line.startswith("hang") for line in watched.stderr.splitlines())
    # no section in the page
    assert 'id="hang"' not in (tmp_path / "watched" / "report.html").read_text()


def test_capture_stacks_dumps_a_process_blocked_in_a_sleep(tmp_path: Path) -> None:
    script = write_script(tmp_path, "nap.py", NAP)
    marker, log, out = tmp_path / "stepped", tmp_path / "log", tmp_path / "out"
    proc = _start(["run", "-o", str(out), str(script), str(marker)], tmp_path, log)
    try:
        _wait_until(marker.exists, proc, log, "three steps")
        result = run_stepcli("capture", out, "--stacks", cwd=tmp_path, timeout=LIMIT_S)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("stacks of 1 process in out/stacks-1/")
        assert "napping" in result.stdout
        (dump,) = _dumps(out / "stacks-1").values()
        assert _functions(dump)[:2] == ["napping", "<module>"]
        assert dump["step"] == 3 and dump["collective"] is None, (
            dump.get("source"),
            log.read_text(),
            result.stderr,
        )
        assert proc.poll() is None  # the run goes on
        again = run_stepcli(
            "capture", str(proc.pid), "--stacks", "--json", cwd=tmp_path, timeout=LIMIT_S
        )
        assert again.returncode == 0, again.stderr
        document = json.loads(again.stdout)
        assert document["folder"].endswith("stacks-2") and len(document["stacks"]) == 1
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hang-timeout", "soon"], "'soon' is not a duration"),
        (["--hang-timeout", "0s"], "too short"),
        (["--hang-timeout", "10x"], "'10x' is not a duration"),
        (["--on-hang", "kill"], "--on-hang kill needs --hang-timeout"),
        (["--hang-timeout", "1m", "--on-hang", "stop"], "'stop' is not one of"),
    ],
)
def test_bad_hang_options_exit_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    script = write_script(tmp_path, "train.py", TRAIN_LOOP)
    result = run_stepcli("run", *args, script, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not list(tmp_path.glob("stepcli-runs"))


def test_capture_stacks_refuses_window_options(tmp_path: Path) -> None:
    result = run_stepcli("capture", tmp_path, "--stacks", "--active", "2", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.count("\n") == 1
        and "--stacks records no window: drop --active" in result.stderr
    )


def test_capture_stacks_of_a_process_whose_threads_cannot_run_comes_from_faulthandler(
    tmp_path: Path,
) -> None:
    script = write_script(tmp_path, "spin.py", SPIN)
    marker, log, out = tmp_path / "stepped", tmp_path / "log", tmp_path / "out"
    proc = _start(["run", "-o", str(out), str(script), str(marker)], tmp_path, log)
    try:
        _wait_until(marker.exists, proc, log, "three steps")
        result = run_stepcli(
            "capture", out, "--stacks", "--timeout", "5", cwd=tmp_path, timeout=LIMIT_S
        )
        assert result.returncode == 0, result.stderr
        assert "could not run (C code holding the GIL?)" in result.stdout
        (dump,) = _dumps(out / "stacks-1").values()
        assert dump["source"] == "faulthandler" and "napping" in dump["faulthandler"]
        # re.match, in C, holding the GIL
        assert _functions(dump)[:3] == ["match", "napping", "<module>"]
    finally:
        _stop(proc)


def test_numbered_collectives_still_compile_in_one_graph(tmp_path: Path) -> None:
    """torch.compile(fullgraph=True) of a function with dist.all_reduce traces through stepcli's
    wrapper."""
    script = write_script(
        tmp_path,
        "compiled.py",
        """
        import os
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
        dist.init_process_group("gloo", rank=0, world_size=1)

        def f(x):
            y = x * 2
            dist.all_reduce(y)
            return y + 1

        g = torch.compile(f, fullgraph=True, backend="eager")
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            print(g(torch.ones(2)).tolist())
            opt.step()
        print(getattr(dist.all_reduce, "_stepcli", False))
        dist.destroy_process_group()
        """,
    )
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    result = run_stepcli(
        "run", "-q", "--hang-timeout", "30s", script, cwd=tmp_path, env={"PORT": port}
    )
    assert result.returncode == 0, result.stderr
    # the wrapper was there, and compiled
    assert result.stdout.splitlines() == ["[3.0, 3.0]"] * 3 + ["True"]


def test_a_rank_stuck_in_c_code_holding_the_gil_is_found_by_a_probe_and_dumped_by_faulthandler(
    tmp_path: Path,
) -> None:
    script = write_script(tmp_path, "hang.py", HANG_HOLDING_THE_GIL)
    out = tmp_path / "out"
    args = [
        "--",
        _torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        tmp_path / "stuck_at",
    ]
    result = run_stepcli(
        "run",
        "--hang-timeout",
        "5s",
        "--on-hang",
        "kill",
        "-o",
        out,
        *args,
        cwd=tmp_path,
        timeout=LIMIT_S + 60,
    )
    assert result.returncode == EXIT_HANG, result.stderr
    dumps = _dumps(out / "hang-1")
    # its Python could not run: faulthandler's C handler wrote it
    assert dumps["rank1"]["source"] == "faulthandler"
    assert _functions(dumps["rank1"])[:2] == ["match", "stuck_forever"]
    assert dumps["rank0"]["collective"]["seq"] == 6 and not dumps["rank0"]["collective"]["returned"]
    verdict = next(line for line in result.stderr.splitlines() if "holds the job back" in line)
    assert "rank 1" in verdict and "stuck_forever" in verdict and "all_reduce #6" in verdict
    # the run summary says it too: the rank, where, and why (its Python could not run)
    lines = result.stderr.splitlines()
    first = lines.index("stepcli summary") + next(
        i
        for i, line in enumerate(lines[lines.index("stepcli summary") :])
        if line.startswith("hang: ")
    )
    block = lines[first : lines.index("  stacks of every process: out/hang-1/", first)]
    said = " ".join(line.strip() for line in block)
    assert (
        f"rank 1 holds the job back: in stuck_forever (hang.py:{STUCK_LINE}), stuck in C code that "
        f"holds the GIL "
        "(its Python could not run) rank 0 waits in all_reduce #6"
    ) in said, block
    assert all(len(line) <= 80 for line in block)


# DDP: rank 1 blocks in `stuck_forever` before the forward of step 20; rank 0 runs its backward,
# where DDP's reducer (C++, called from autograd, not from Python) all-reduces the gradients and
# waits for rank 1 forever.
DDP_HANG = """
    import datetime
    import sys
    import threading
    import time
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def stuck_forever(marker):
        marker.write_text(repr(time.time()))
        threading.Event().wait()

    def main():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
        rank = dist.get_rank()
        model = DDP(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(40):
            if step == 20 and rank == 1:
                stuck_forever(Path(sys.argv[1]))
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        dist.destroy_process_group()

    main()
"""


def _ddp_killed(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    script = write_script(tmp_path, "ddp.py", DDP_HANG)
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--hang-timeout",
        "5s",
        "--on-hang",
        "kill",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        "--",
        _torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        tmp_path / "stuck_at",
        cwd=tmp_path,
        env=env,
        timeout=LIMIT_S + 60,
    )
    summary = (
        json.loads((tmp_path / "run.json").read_text())
        if (tmp_path / "run.json").exists()
        else None
    )
    return {"result": result, "out": out, "summary": summary}


@pytest.fixture(scope="module")
def ddp_killed_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-rank DDP job hung in DDP's reducer at step 20, ended by `--on-hang kill`."""
    return _ddp_killed(tmp_path_factory.mktemp("ddp_killed"))


def test_on_hang_kill_of_a_ddp_job_keeps_every_step_of_every_rank(
    ddp_killed_job: dict[str, Any],
) -> None:
    result, summary = ddp_killed_job["result"], ddp_killed_job["summary"]
    assert result.returncode == EXIT_HANG, result.stderr
    # every step before the hang is counted and timed (not the 5 of the last saved window)
    assert summary["steps"]["global"] == 20, (summary["steps"], result.stderr)
    lines = result.stderr.splitlines()
    steps_line = next(
        line for line in lines[lines.index("stepcli summary") :] if line.startswith("steps ")
    )
    assert steps_line.split()[1] == "20", steps_line
    assert [(p["rank"], p["global_steps"]) for p in summary["processes"]] == [(0, 20), (1, 20)]
    # both ranks wrote their final step log on the SIGTERM, rank 0 from its stacks thread (its main
    # thread was blocked in the reducer's C++ wait, where no Python signal handler runs)
    assert [p["exit"] for p in summary["processes"]] == ["SIGTERM", "SIGTERM"], summary["processes"]
    assert summary["step_time_ms"]["untouched"]["count"] >= 2 * 14
    assert sorted((r["rank"], r["steps"]) for r in summary["step_record"]) == [(0, 20), (1, 20)]
    assert not [note for note in summary["notes"] if "never written" in note], summary["notes"]
    assert "hang: at step 20" in result.stderr


def test_a_hang_in_ddps_reducer_names_the_collective_in_flight(
    ddp_killed_job: dict[str, Any],
) -> None:
    result, summary, out = (
        ddp_killed_job["result"],
        ddp_killed_job["summary"],
        ddp_killed_job["out"],
    )
    dumps = _dumps(out / "hang-1")
    # no Python collective was ever called: the reducer's is C++
    assert dumps["rank0"]["collective"] is None
    assert [e["name"] for e in dumps["rank0"]["in_flight"]][:1] == ["all_reduce"], dumps["rank0"][
        "in_flight"
    ]
    assert dumps["rank1"]["in_flight"] == []  # known: none in flight
    (report,) = summary["hang"]["reports"]
    rank0, rank1 = report["processes"]
    assert rank0["waiting"] is True and rank1["waiting"] is False
    assert (
        rank0["collective"]["name"] == "all_reduce"
        and rank0["collective"]["source"] == "flight_recorder"
    )
    seq = rank0["collective"]["seq"]
    assert report["verdict"].startswith("-> rank 1 (pid ")
    assert "stuck_forever" in report["verdict"] and f"all_reduce #{seq}" in report["verdict"], (
        report["verdict"]
    )
    assert "holds the job back" in report["verdict"]
    block = result.stderr[result.stderr.index("hang: at step 20") :]
    assert "no process waits in a collective" not in result.stderr
    assert "rank 1 holds the job back: in stuck_forever (ddp.py:" in block
    assert f"rank 0 waits in all_reduce #{seq}" in block
    page = (out / "report.html").read_text()
    section = _hang_section(page)
    assert "No verdict" not in section and "holds the job back" in section
    assert "issued from C++" in section


def test_without_the_flight_recorder_a_reducer_hang_is_said_unknown_not_elsewhere(
    tmp_path: Path,
) -> None:
    # GIVEN the flight recorder turned off by the user WHEN rank 0 hangs in DDP's reducer
    job = _ddp_killed(tmp_path, env={"TORCH_FR_BUFFER_SIZE": "0"})
    result, summary = job["result"], job["summary"]
    assert result.returncode == EXIT_HANG, result.stderr
    (report,) = summary["hang"]["reports"]
    # THEN nobody is said to be outside every collective: that is unknown, and rank 0 is said to be
    # in backward()
    assert [p["collectives_known"] for p in report["processes"]] == [False, False]
    assert (
        "unknown" in report["verdict"]
        and "rank 0 (pid" in report["verdict"]
        and "backward()" in report["verdict"]
    )
    lines = result.stderr.splitlines()
    block = lines[next(i for i, line in enumerate(lines) if line.startswith("hang: at step 20")) :][
        :8
    ]
    text = " ".join(line.strip() for line in block)
    assert (
        "no process waits in a collective called from Python; collectives issued from C++ are "
        "unknown" in text
    )
    assert "rank 0 is in backward() from main (ddp.py:" in text
    assert "rank 0 is in main" not in text
    section = _hang_section((job["out"] / "report.html").read_text())
    assert "is unknown" in section


# Steps three times, writes its pid, then stops itself: a one-process job that can neither step nor
# answer.
STOPS_ITSELF = """
    import os
    import signal
    import sys
    from pathlib import Path
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    Path(sys.argv[1]).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)
    import time
    time.sleep(600)
"""

# Steps three times, then double-forks a sleeper in a session of its own (a daemon: its parent exits
# at once, so it is nobody's child in the program's tree), writes the sleeper's pid, then hangs in
# `napping`.
DAEMONIZES = """
    import os
    import sys
    import time
    from pathlib import Path
    import torch

    def napping():
        time.sleep(600)

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(read_fd)
            os.write(write_fd, str(os.getpid()).encode())
            os.close(write_fd)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # a daemon holds nobody's pipes open
                os.dup2(devnull, fd)
            os.execvp("sleep", ["sleep", "600"])
        os._exit(0)
    os.close(write_fd)
    pid = b""
    while chunk := os.read(read_fd, 32):
        pid += chunk
    os.wait()
    Path(sys.argv[1]).write_text(pid.decode())
    napping()
"""


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _run_until_done(args: list[str], cwd: Path, log: Path) -> int:
    """`stepcli ARGS` to its end (a generous deadline: on failure the whole session is killed and
    the test fails)."""
    proc = _start(args, cwd, log)
    try:
        proc.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGCONT)
        raise AssertionError(
            f"the run did not end within {LIMIT_S} s:\n{log.read_text()}"
        ) from None
    finally:
        _stop(proc)
    return proc.returncode


def test_a_stopped_one_process_job_is_called_hung_and_on_hang_kill_ends_it(tmp_path: Path) -> None:
    # (issue 30, item 15) a SIGSTOPped process writes no stall file: alone, it was never called hung
    script = write_script(tmp_path, "stops.py", STOPS_ITSELF)
    log, marker = tmp_path / "log.txt", tmp_path / "pid"
    status = _run_until_done(
        [
            "run",
            "--hang-timeout",
            "2s",
            "--on-hang",
            "kill",
            "-o",
            "out",
            "--json",
            "run.json",
            str(script),
            str(marker),
        ],
        tmp_path,
        log,
    )
    text = log.read_text()
    assert status == EXIT_HANG, text
    pid = int(marker.read_text())
    assert not _running(pid)
    block = _block(log)
    assert any(
        line.startswith("stepcli: hang: no process completed a step for ") for line in block
    ), block
    assert (
        f"stepcli:   pid {pid} on {os.uname().nodename}: stopped (SIGSTOP, or held by a debugger)"
        in text
    ), block
    assert any(
        line.startswith(f"stepcli: -> pid {pid} on ") and "is stopped" in line for line in block
    ), block
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["exit_status"] == EXIT_HANG and summary["hang"]["ended_job"] is True
    (report,) = summary["hang"]["reports"]
    assert [(p["pid"], p["source"]) for p in report["processes"]] == [(pid, "stopped")]
    assert "is stopped" in report["verdict"]
    assert summary["steps"]["global"] == 3  # continued after its SIGTERM, it saved its step log
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("hang: "))
    assert (
        lines[first + 1]
        == f"  pid {pid} holds the job back: stopped (SIGSTOP, or held by a debugger)"
    ), lines


def test_on_hang_kill_leaves_no_daemonized_descendant_running(tmp_path: Path) -> None:
    # (issue 30, item 16) a double-forked `setsid` sleeper is outside the program's tree: it
    # outlived exit 124
    script = write_script(tmp_path, "daemon.py", DAEMONIZES)
    log, marker = tmp_path / "log.txt", tmp_path / "pid"
    try:
        status = _run_until_done(
            [
                "run",
                "--hang-timeout",
                "2s",
                "--on-hang",
                "kill",
                "-o",
                "out",
                str(script),
                str(marker),
            ],
            tmp_path,
            log,
        )
        assert status == EXIT_HANG, log.read_text()
        sleeper = int(marker.read_text())
        assert not _running(sleeper), log.read_text()
    finally:
        if marker.exists() and marker.read_text() and _running(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)


def test_a_job_ended_by_a_forwarded_sigterm_leaves_no_daemonized_descendant_running(
    tmp_path: Path,
) -> None:
    script = write_script(tmp_path, "daemon.py", DAEMONIZES)
    log, marker = tmp_path / "log.txt", tmp_path / "pid"
    proc = _start(["run", "-o", "out", str(script), str(marker)], tmp_path, log)
    try:
        _wait_until(lambda: marker.exists() and marker.read_text(), proc, log, "the sleeper's pid")
        # a scheduler's pre-emption: to stepcli alone, forwarded to the program
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=LIMIT_S)
        assert proc.returncode == 128 + signal.SIGTERM, log.read_text()
        assert not _running(int(marker.read_text())), log.read_text()
    finally:
        _stop(proc)
        if marker.exists() and marker.read_text() and _running(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)


def test_a_daemon_the_program_leaves_on_purpose_outlives_a_successful_run(tmp_path: Path) -> None:
    # as without stepcli: a program that exits 0 keeps the server it daemonized
    script = write_script(
        tmp_path, "daemon.py", DAEMONIZES.replace("napping()\n", "").rstrip() + "\n"
    )
    marker = tmp_path / "pid"
    try:
        result = run_stepcli(
            "run", "-q", "--no-report", "-o", tmp_path / "out", script, marker, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        assert _running(int(marker.read_text()))
    finally:
        if marker.exists() and marker.read_text() and _running(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)


def test_on_hang_kill_fires_after_the_control_folder_is_renamed_away(tmp_path: Path) -> None:
    # GIVEN a one-process job that steps, then sleeps for ever, under --hang-timeout 2s --on-hang
    # kill
    script = write_script(tmp_path, "nap.py", NAP)
    log, marker = tmp_path / "log.txt", tmp_path / "stepped"
    args = [
        "run",
        "--hang-timeout",
        "2s",
        "--on-hang",
        "kill",
        "-o",
        "out",
        str(script),
        str(marker),
    ]
    proc = _start(args, tmp_path, log)
    try:
        _wait_until(marker.exists, proc, log, "the program's steps")
        # WHEN another user renames OUT/.stepcli away (a shared, non-sticky folder) (issue 47,
        # defect 6)
        os.rename(tmp_path / "out" / ".stepcli", tmp_path / "out" / ".moved-away")
        # THEN the hang is still called and the job ended, with the hang's exit status
        proc.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"--on-hang kill never fired:\n{log.read_text()}") from None
    finally:
        _stop(proc)
    text = log.read_text()
    assert proc.returncode == EXIT_HANG, text
    assert any(
        line.startswith("stepcli: hang: no process completed a step for ") for line in _block(log)
    ), text
