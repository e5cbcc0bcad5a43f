"""`stepcli run X` behaves like `python X`: the program cannot tell the difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_python, run_stepcli, write_script

ENV_REPORT = """
    import json, os, sys
    import sibling
    print(json.dumps({
        "name": __name__,
        "file": __file__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "spec": getattr(__spec__, "name", None),
        "sibling": sibling.VALUE,
    }))
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_script(tmp_path, "app/report.py", ENV_REPORT)
    write_script(tmp_path, "app/sibling.py", "VALUE = 'found next to the script'\n")
    write_script(tmp_path, "pkg/__init__.py", "")
    write_script(tmp_path, "pkg/sibling.py", "VALUE = 'found in the package'\n")
    write_script(
        tmp_path, "pkg/mod.py", ENV_REPORT.replace("import sibling", "from pkg import sibling")
    )
    return tmp_path


def stepcli_quiet(*args: object, cwd: Path) -> object:
    return run_stepcli("run", "--quiet", "-o", cwd / "out", *args, cwd=cwd)


@pytest.mark.parametrize("args", [[], ["--wait", "5", "-o", "x", "--help", "-m", "--", "plain"]])
def test_script_sees_the_same_world(project: Path, args: list[str]) -> None:
    ours = stepcli_quiet("app/report.py", *args, cwd=project)
    theirs = run_python("app/report.py", *args, cwd=project)
    assert ours.returncode == theirs.returncode == 0, ours.stderr
    assert json.loads(ours.stdout) == json.loads(theirs.stdout)
    assert json.loads(ours.stdout)["argv"] == ["app/report.py", *args]


def test_far_away_script(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    ours = stepcli_quiet(project / "app/report.py", cwd=elsewhere)
    theirs = run_python(project / "app/report.py", cwd=elsewhere)
    assert json.loads(ours.stdout) == json.loads(theirs.stdout)


def test_module_mode(project: Path) -> None:
    ours = stepcli_quiet("-m", "pkg.mod", "--lr", "0.1", cwd=project)
    theirs = run_python("-m", "pkg.mod", "--lr", "0.1", cwd=project)
    assert ours.returncode == 0, ours.stderr
    assert json.loads(ours.stdout) == json.loads(theirs.stdout)
    assert json.loads(ours.stdout)["name"] == "__main__"


@pytest.mark.parametrize(
    "source, status",
    [
        ("import sys\nsys.exit(3)\n", 3),
        ("import sys\nsys.exit('bad config')\n", 1),
        ("raise SystemExit(0)\n", 0),
    ],
)
def test_exit_status_is_the_programs(tmp_path: Path, source: str, status: int) -> None:
    script = write_script(tmp_path, "exits.py", source)
    ours = stepcli_quiet(script, cwd=tmp_path)
    theirs = run_python(script, cwd=tmp_path)
    assert ours.returncode == theirs.returncode == status
    assert ours.stderr == theirs.stderr


def test_uncaught_exception_has_the_same_traceback(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "boom.py",
        """
        def inner():
            raise ValueError("boom")
        inner()
    """,
    )
    ours = stepcli_quiet(script, cwd=tmp_path)
    theirs = run_python(script, cwd=tmp_path)
    assert ours.returncode == theirs.returncode == 1
    assert ours.stderr == theirs.stderr
    assert "ValueError: boom" in ours.stderr


def test_stdin_is_inherited(tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import stepcli_env

    script = write_script(
        tmp_path, "echo.py", "import sys\nprint(sys.stdin.read().upper(), end='')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "stepcli", "run", "-q", "-o", tmp_path / "out", script],
        input="piped in\n",
        capture_output=True,
        text=True,
        env=stepcli_env(),
        timeout=60,
    )
    assert result.stdout == "PIPED IN\n"
