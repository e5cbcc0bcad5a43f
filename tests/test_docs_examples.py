"""Every command example in README.md and docs/ is checked (see tests/docs_examples.py for the block
kinds): console sessions run for real and their shown lines are compared, copy-me commands are
parsed by stepcli's own parser, and the blocks marked illustrative stay few."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import stepcli_env
from docs_examples import REPO, Block, blocks, doc_files, sessions, shown_lines_match, stepcli_lines

ALL_BLOCKS: list[Block] = [block for path in doc_files() for block in blocks(path)]
COPY_ME = ("sh", "bash", "shell", "inline")


def _command_names() -> set[str]:
    from stepcli.cli import cli

    return set(cli.commands)


COMMAND_NAMES = _command_names()


def _is_synopsis(argv: list[str]) -> bool:
    """`stepcli run [OPTIONS] SCRIPT [ARGS]...`: a syntax line, not an example (placeholders in
    capitals, options in brackets, an ellipsis)."""
    return any(
        word.startswith("[")
        or word.endswith("...")
        or word == "..."
        or (word.isupper() and len(word) > 1)
        for word in argv
    )


def _copy_me_commands() -> list[tuple[str, list[str]]]:
    found = []
    for block in ALL_BLOCKS:
        if block.lang not in COPY_ME or block.illustrative:
            continue
        for line, argv in stepcli_lines(block):
            # (`stepcli: ...` and `stepcli top: ...` lines are output shown beside the commands)
            if argv and argv[0] in COMMAND_NAMES and not _is_synopsis(argv):
                found.append(
                    (
                        f"{block.path.relative_to(REPO)}:{line}"
                        f"{' (prose)' if block.lang == 'inline' else ''}",
                        argv,
                    )
                )
    return found


COPY_ME_COMMANDS = _copy_me_commands()


def parse_only(argv: list[str], mention: bool = False) -> None:
    """Parse `stepcli ARGV` as the command line would, without running the command. A mention in
    prose (`stepcli table --json`) names a command and options without the rest: its options must
    exist, and the values it gives must be valid, but missing arguments and a last option's missing
    value are not errors."""
    from stepcli.cli import cli

    if mention and len(argv) > 1 and argv[-1].startswith("--") and "=" not in argv[-1]:
        argv = argv[:-1] if _takes_value(argv[0], argv[-1]) else argv
    with click.Context(cli, info_name="stepcli", resilient_parsing=mention) as ctx:
        command = cli.get_command(ctx, argv[0]) if argv else None
        if command is None:
            raise click.UsageError(f"no command {argv[:1]}", ctx=ctx)
        # (click's resilient parsing lets unknown options pass: they are looked up here)
        if mention:
            # (`demo` passes its options on to `run`)
            options_of = cli.commands["run"] if argv[0] == "demo" else command
            known = {
                o
                for p in options_of.params
                if isinstance(p, click.Option)
                for o in (*p.opts, *p.secondary_opts)
            }
            known |= {"-h", "--help"}
            for word in argv[1 : argv.index("--") if "--" in argv else len(argv)]:
                if word.startswith("-") and len(word) > 1 and word.split("=")[0] not in known:
                    raise click.NoSuchOption(word.split("=")[0], ctx=ctx)
        try:
            command.make_context(
                argv[0], list(argv[1:]), parent=ctx, resilient_parsing=mention
            ).close()
        except click.exceptions.Exit:  # --help, --version: parsed fine
            pass


DEMOS = list(
    {tuple(argv): (where, argv) for where, argv in COPY_ME_COMMANDS if argv[0] == "demo"}.values()
)


@pytest.mark.parametrize(("where", "argv"), DEMOS, ids=[w for w, _ in DEMOS])
def test_demo_examples_run(where: str, argv: list[str], tmp_path: Path) -> None:
    """`stepcli demo` examples need nothing but stepcli and torch: they run for real (options after
    `--` go to the demo script, which only a run can check)."""
    done = subprocess.run(
        [sys.executable, "-m", "stepcli", *argv],
        cwd=tmp_path,
        env=stepcli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, (
        f"{where}: `stepcli {' '.join(argv)}` exited {done.returncode}\n{done.stderr}"
    )
    # AND the demo script got `--iterations N` (it prints every 4th iteration: the last one shown
    # says so)
    if "--" in argv and "--iterations" in argv[argv.index("--") :]:
        iterations = int(argv[argv.index("--iterations") + 1])
        assert f"iteration {(iterations - 1) // 4 * 4:3d}  loss" in done.stdout, (
            f"{where}\n{done.stdout}"
        )
        assert f"iteration {(iterations - 1) // 4 * 4 + 4:3d}  loss" not in done.stdout, (
            f"{where}\n{done.stdout}"
        )
    # AND `-- --help` lists the demo script's options, as the page says
    if "--" in argv and "--help" in argv[argv.index("--") :]:
        assert all(
            f"--{name}" in done.stdout for name in ("iterations", "batch-size", "lr", "device")
        ), done.stdout


def _takes_value(command_name: str, option: str) -> bool:
    from stepcli.cli import cli

    command = cli.commands.get(command_name)
    for param in command.params if command else []:
        if isinstance(param, click.Option) and option in param.opts:
            return not param.is_flag and not param.count
    return False


def test_the_docs_have_command_examples() -> None:
    assert len(COPY_ME_COMMANDS) >= 20, COPY_ME_COMMANDS
    assert any(block.lang == "console" for block in blocks(REPO / "README.md")), (
        "README's walk-through is run"
    )


@pytest.mark.parametrize(("where", "argv"), COPY_ME_COMMANDS, ids=[w for w, _ in COPY_ME_COMMANDS])
def test_copy_me_commands_parse(where: str, argv: list[str]) -> None:
    try:
        parse_only(argv, mention=where.endswith("(prose)"))
    except click.UsageError as exc:
        pytest.fail(f"{where}: `stepcli {' '.join(argv)}` does not parse: {exc.format_message()}")


def test_a_drifted_example_is_caught() -> None:
    """The check can fail: an option stepcli does not have, or a missing value, is refused."""
    with pytest.raises(click.UsageError):
        parse_only(["run", "--no-such-option", "train.py"])
    with pytest.raises(click.UsageError):
        parse_only(["compare", "a.json", "b.json", "--tolerance"])
    with pytest.raises(click.UsageError):
        parse_only(["run", "--active", "0", "train.py"])
    with pytest.raises(click.UsageError):
        parse_only(["table", "--no-such-option"], mention=True)
    parse_only(["table", "--json"], mention=True)  # a mention of an option, not an example


def test_illustrative_marking_is_rare_and_explained() -> None:
    commands = [b for b in ALL_BLOCKS if b.lang in ("sh", "bash", "shell", "console")]
    marked = [b for b in commands if b.illustrative]
    assert all(b.illustrative and len(b.illustrative) > 10 for b in marked)
    assert len(marked) <= max(3, len(commands) // 5), [f"{b.path.name}:{b.line}" for b in marked]


CONSOLE_PAGES = sorted({b.path for b in ALL_BLOCKS if b.lang == "console" and not b.illustrative})


@pytest.mark.parametrize(
    "page", CONSOLE_PAGES, ids=[str(p.relative_to(REPO)) for p in CONSOLE_PAGES]
)
def test_console_sessions_run_as_shown(page: Path, tmp_path: Path) -> None:
    """Each page's sessions run in order in one scratch folder holding `train.py` (stepcli's demo
    script) and the documentation's example files (`docs/examples/`)."""
    shutil.copy(REPO / "stepcli" / "demo" / "train.py", tmp_path / "train.py")
    shutil.copytree(REPO / "docs" / "examples", tmp_path / "docs" / "examples")
    env = stepcli_env({"COLUMNS": "80"})
    for block in (b for b in blocks(page) if b.lang == "console" and not b.illustrative):
        for step in sessions(block):
            command = step.command
            if command.startswith("stepcli "):
                command = f"{sys.executable} -m {command}"
            elif command.startswith("python "):
                command = f"{sys.executable} {command[len('python ') :]}"
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                stdin=subprocess.DEVNULL,
            )
            printed = done.stdout + done.stderr
            where = f"{page.relative_to(REPO)}:{step.line}: $ {step.command}"
            assert done.returncode == step.exit_code, f"{where}: exit {done.returncode}\n{printed}"
            missing = shown_lines_match(step.shown, printed, tmp_path)
            assert missing is None, (
                f"{where}: shown line not printed: {missing!r}\nprinted:\n{printed}"
            )


def test_the_ci_gate_job_installs_stepcli_from_a_checkout_and_its_commands_run(
    tmp_path: Path,
) -> None:
    """docs/concepts/ci-gates.md's GitHub Actions job, step by step (issue 49: its `pip install
    stepcli` failed, stepcli being on no package index): the install names the checkout the job
    makes, and its stepcli commands run as written, against a baseline recorded the same way."""
    import re
    import shlex

    (job,) = [b for b in blocks(REPO / "docs" / "concepts" / "ci-gates.md") if b.lang == "yaml"]
    runs = [line.split("run: ", 1)[1] for line in job.lines if line.strip().startswith("- run: ")]
    installs = [shlex.split(r) for r in runs if r.startswith("pip install ")]
    assert ["pip", "install", "stepcli"] not in installs
    checkout = next(line for line in job.lines if "repository:" in line)
    folder = checkout.split("path:", 1)[1].strip(" }")
    assert ["pip", "install", f"./{folder}"] in installs, (installs, checkout)
    # (the checkout itself installs: CI's fresh environment does `pip install` from this repository)
    commands = [shlex.split(r) for r in runs if r.startswith("stepcli ")]
    assert [c[:2] for c in commands] == [["stepcli", "run"], ["stepcli", "compare"]], commands
    shutil.copy(REPO / "stepcli" / "demo" / "train.py", tmp_path / "train.py")
    (tmp_path / "perf").mkdir()
    env = stepcli_env({"COLUMNS": "80"})

    def stepcli(argv: list[str]) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable if a == "python" else a for a in argv]
        return subprocess.run(
            [sys.executable, "-m", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    record, gate = commands
    baseline = [
        a.replace("current.json", "perf/baseline.json").replace("traces", "base-traces")
        for a in record
    ]
    for argv in (baseline, record):
        done = stepcli(argv)
        assert done.returncode == 0, done.stderr
    done = stepcli(gate)
    # a verdict (noise can say INCONCLUSIVE)
    assert done.returncode in (0, 1, 4), done.stdout + done.stderr
    assert re.search(r"^(NO CHANGE|IMPROVEMENT|REGRESSION|INCONCLUSIVE): ", done.stdout, re.M), (
        done.stdout
    )


def test_the_site_starts_with_a_getting_started_page() -> None:
    # issue 49: the site's index pointed to "the walk-through in README.md", which is not on the
    # site
    nav = [
        line.strip()
        for line in (REPO / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].splitlines()
    ]
    assert nav[0] == "- Getting started: getting-started.md", nav[:3]
    index = (REPO / "docs" / "index.md").read_text()
    assert "(getting-started.md)" in index and "README.md" not in index
    page = (REPO / "docs" / "getting-started.md").read_text()
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## Install", "## A first run", "## Reading the summary"], headings
    assert headings[-1] == "## Next steps" and REPO / "docs" / "getting-started.md" in CONSOLE_PAGES
