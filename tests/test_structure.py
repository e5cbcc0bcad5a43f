"""Structure: no import circle among stepcli's modules, counting imports made only for type checking
too."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "stepcli"


def _imports(path: Path) -> set[str]:
    """Modules of the package that `path` imports anywhere (top level, in functions, under
    TYPE_CHECKING)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(
                    candidate
                    if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists()
                    else base
                )
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("stepcli") and name != module}


def test_no_import_cycles() -> None:
    graph = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): _imports(p)
        for p in PACKAGE.rglob("*.py")
        if "_bootstrap" not in p.parts
    }
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            cycles.append(trail[trail.index(node) :] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, trail + [node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    assert not cycles, cycles[0]


# The shared leaf modules every package may use: errors, reading untrusted files, statistics,
# formatting, the console that writes no trailing spaces to pipes.
_LEAVES = {
    "stepcli",
    "stepcli.errors",
    "stepcli.inputs",
    "stepcli.limits",
    "stepcli.commands.pathparam",
    "stepcli.stats",
    "stepcli.jsonchecks",
    "stepcli.fmt",
    "stepcli.safetext",
    "stepcli.pipeconsole",
    "stepcli.safefile",
    "stepcli.runfolder",
    "stepcli.runfolder.layout",
}
# The names and keys of the files the agent writes are stepcli.runfolder.layout's (a shared leaf,
# above); the trace reader reads, of the agent itself, only its repair of the names PyTorch writes
# with bare quotes.
_AGENT_FILE_FORMAT = {"stepcli.agent.tracenames"}


def _package_imports(package: str) -> dict[str, set[str]]:
    """Every module of `package` (a folder or a single module) -> the stepcli modules it imports."""
    folder = PACKAGE / package.replace("stepcli.", "", 1).replace(".", "/")
    files = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
    return {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): _imports(p) for p in files
    }


def _outside(package: str, allowed: set[str], allowed_packages: tuple[str, ...] = ()) -> list[str]:
    """`module -> import` for every import of `package` that is neither allowed nor inside an
    allowed package."""
    inside = (package, *allowed_packages)
    return [
        f"{module} -> {name}"
        for module, names in _package_imports(package).items()
        for name in sorted(names)
        if name not in allowed and not any(name == p or name.startswith(p + ".") for p in inside)
    ]


def test_agent_imports_nothing_of_stepcli_outside_the_agent() -> None:
    # It runs inside the profiled program: standard library only, import-light. Files are created
    # through stepcli.safefile, and named by stepcli.runfolder.layout, both standard library only
    # (checked below).
    allowed = {"stepcli", "stepcli.safefile", "stepcli.runfolder", "stepcli.runfolder.layout"}
    assert _outside("stepcli.agent", allowed) == []


def _top_imports(path: Path) -> set[str]:
    """Every module `path` imports, by name, anywhere in it."""
    tree = ast.parse(path.read_text())
    names = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    return names | {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    }


def test_run_folder_layout_is_standard_library_only() -> None:
    # Issue 50: the one home of the run folder's names; every profiled process imports it (the
    # agent), so `os` only, and the package it sits in imports nothing.
    assert _top_imports(PACKAGE / "runfolder" / "layout.py") <= {"__future__", "os"}
    assert _top_imports(PACKAGE / "runfolder" / "__init__.py") == set()


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module and of its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_the_run_folder_is_named_only_in_its_layout() -> None:
    # Issue 50: `<out>/.stepcli/<run-id>/` was rebuilt by hand in a dozen modules; its name (and
    # every file name in it) is stepcli.runfolder.layout's. Docstrings and comments may say it; code
    # takes it from there.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "runfolder" / "layout.py":
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
            ):
                if ".stepcli" in node.value:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:60]!r}")
    assert found == []


def test_safefile_imports_only_light_standard_modules() -> None:
    # Every file stepcli creates goes through it, the agent's included: no stepcli module, nothing
    # heavy.
    tree = ast.parse((PACKAGE / "safefile.py").read_text())
    names = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    # collections.abc: no heavier than typing, which imports it (both only under TYPE_CHECKING there
    # today)
    assert names <= {"__future__", "collections.abc", "errno", "os", "signal", "stat", "typing"}, (
        names
    )


def test_traces_import_only_the_shared_leaves() -> None:
    assert _outside("stepcli.traces", _LEAVES | _AGENT_FILE_FORMAT) == []


def test_trace_layers_import_only_downward() -> None:
    # read/ (bytes -> columns) < analyses/ (figures) < render/ (tables); the files-at-once engine,
    # merge and the run end's read sit above them in stepcli.traces itself.
    leaves = _LEAVES | _AGENT_FILE_FORMAT
    assert _outside("stepcli.traces.read", leaves) == []
    assert _outside("stepcli.traces.analyses", leaves, ("stepcli.traces.read",)) == []
    assert (
        _outside(
            "stepcli.traces.render", leaves, ("stepcli.traces.analyses", "stepcli.traces.read")
        )
        == []
    )


def test_compare_imports_only_the_leaves_traces_and_the_run_summary() -> None:
    assert (
        _outside(
            "stepcli.compare",
            _LEAVES,
            (
                "stepcli.traces",
                "stepcli.runfolder.summaryfile",
                "stepcli.runfolder.summaryread",
                "stepcli.runfolder.runs",
            ),
        )
        == []
    )


def test_whatif_imports_only_the_leaves_traces_and_the_run_folder() -> None:
    assert (
        _outside(
            "stepcli.whatif",
            _LEAVES,
            (
                "stepcli.traces",
                "stepcli.runfolder.summaryfile",
                "stepcli.runfolder.summaryread",
                "stepcli.runfolder.runs",
            ),
        )
        == []
    )


def test_advice_imports_only_the_leaves_the_summary_models_and_traces() -> None:
    # One home for advice rules, shared by run/, report/ and snapshots/: it imports none of them.
    models = {"stepcli.runfolder.summaryfile", "stepcli.steptimes"}
    assert _outside("stepcli.advice", _LEAVES | models, ("stepcli.traces",)) == []


def test_run_layers_import_only_downward() -> None:
    # The launcher (stepcli.run itself) may use live/ and summary/; live/ may use summary/ and the
    # launch's two shared pieces (the control folder, the subreaper); summary/ uses nothing else of
    # run/.
    def run_imports(package: str) -> list[str]:
        return [
            f"{m} -> {n}"
            for m, names in _package_imports(package).items()
            for n in sorted(names)
            if n == "stepcli.run" or n.startswith("stepcli.run.")
        ]

    assert [
        i for i in run_imports("stepcli.run.summary") if "-> stepcli.run.summary" not in i
    ] == []
    allowed = (
        "stepcli.run.live",
        "stepcli.run.summary",
        "stepcli.run.controldir",
        "stepcli.run.subreaper",
    )
    assert [
        i for i in run_imports("stepcli.run.live") if not i.split(" -> ")[1].startswith(allowed)
    ] == []


def test_report_never_imports_run_or_compare() -> None:
    # The page renders a run summary and traces; the run summary (and its advice) is built in
    # stepcli.run.
    forbidden = ("stepcli.run", "stepcli.compare", "stepcli.agent")
    imports = _package_imports("stepcli.report")
    found = [
        f"{m} -> {n}"
        for m, names in imports.items()
        for n in names
        for f in forbidden
        if n == f or n.startswith(f + ".")
    ]
    assert found == []


def test_run_summary_model_imports_no_package() -> None:
    # run/ writes it, report/ and compare/ read it: it depends on none of them (nor on traces or the
    # agent).
    assert _outside("stepcli.runfolder.summaryfile", _LEAVES) == []
    assert (
        _outside("stepcli.runfolder.summaryread", _LEAVES | {"stepcli.runfolder.summaryfile"}) == []
    )
    assert _outside("stepcli.steptimes", _LEAVES | {"stepcli.runfolder.summaryfile"}) == []
    assert (
        _outside(
            "stepcli.runfolder.runs",
            _LEAVES | {"stepcli.runfolder.summaryfile", "stepcli.runfolder.summaryread"},
        )
        == []
    )
    # The step-log and step-record readers read what the agent writes: its config, signing and
    # output checks.
    agent_formats = {
        "stepcli.agent.config",
        "stepcli.agent.signing",
        "stepcli.agent.output",
        "stepcli.steptimes",
    }
    assert _outside("stepcli.runfolder", _LEAVES | agent_formats) == []
    assert _outside("stepcli.fmt", "stepcli.safetext", _LEAVES) == []


def test_report_reads_files_only_through_inputs() -> None:
    # Regular files only, bounded in size, never blocking (stepcli.inputs): no raw open() or json
    # parsing in report/.
    found = []
    for path in sorted((PACKAGE / "report").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "open"
            ):
                found.append(f"{path.name}:{node.lineno} open()")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "read_text"
            ):
                found.append(f"{path.name}:{node.lineno} read_text()")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + (
                    [node.module] if isinstance(node, ast.ImportFrom) else []
                )
                found += [
                    f"{path.name}:{node.lineno} import {n}"
                    for n in names
                    if n in ("json", "orjson")
                ]
    assert found == []


# Every file stepcli reads outside the agent goes through stepcli.inputs (files given to it, traces)
# or stepcli.runfolder.runs (stepcli's own files in a run folder, read_saved / read_saved_json):
# regular files only, bounded, never blocking, never through a link. What else opens or parses a
# file, each for a reason:
_READS_OUTSIDE_INPUTS = {
    "inputs.py": "the reader of files given to stepcli",
    "safefile.py": "read_regular: a regular file of this user, opened without following a link",
    "runfolder/runs.py": "read_saved_json: stepcli's own JSON in a run folder, its one failure "
    "policy",
    "runfolder/summaryread.py": "decodes the bytes of a run summary already read (inputs or "
    "read_saved)",
    "runfolder/steplogreader.py": "decodes a step log read by inputs.read_input, saying why one is "
    "left out",
    "compare/load.py": "decodes a run summary given on the command line, read by inputs.read_input",
    "run/live/liverun.py": "decodes STEPCLI_CONFIG, an environment variable's text (no file)",
    "snapshots/snapshotreader.py": "open(fd): a descriptor opened non-blocking and checked with "
    "fstat",
    "traces/forkmap.py": "open(pipe): the pipe from its own forked child",
}
_PROC = ("/proc/",)  # the kernel's files (a process's state, its children, memory): never a user's


def test_files_are_read_only_through_inputs_outside_the_agent() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] in ("agent", "_bootstrap") or relative.startswith("traces/read/"):
            # the agent (standard library only, writes through safefile); the trace reader itself
            continue
        if relative in _READS_OUTSIDE_INPUTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                first = node.args[0] if node.args else None
                text = ast.unparse(first) if first is not None else ""
                if not any(text.lstrip("f").strip("'\"").startswith(p) for p in _PROC):
                    found.append(f"{relative}:{node.lineno} open({text})")
            elif isinstance(func, ast.Attribute) and func.attr in ("read_text", "read_bytes"):
                found.append(f"{relative}:{node.lineno} {func.attr}()")
            elif isinstance(func, ast.Attribute) and func.attr in ("load", "loads"):
                owner = ast.unparse(func.value)
                if owner in ("json", "orjson", "pickle"):
                    found.append(f"{relative}:{node.lineno} {owner}.{func.attr}()")
    assert found == []


# Files created without stepcli.safefile, each for a reason: appending to a file the CI system made,
# the trace export's own files inside the private scratch folder it just created, lock and fault
# files opened for append or locking (O_NOFOLLOW, in the private control folder).
_CREATES_OUTSIDE_SAFEFILE = {
    # $GITHUB_STEP_SUMMARY, never blocking
    ("compare/comparemain.py", "os.O_APPEND | os.O_CREAT | os.O_NONBLOCK"),
    ("agent/output.py", 'gzip.open(tmp_gz, "wb"'),  # inside the private scratch folder
    ("agent/output.py", 'open(tmp_json, "r+b")'),  # the same
    ("agent/stacks.py", "os.O_CREAT | os.O_APPEND"),  # the fault-handler file, control folder
    ("agent/slowtrigger.py", "os.O_RDWR | os.O_CREAT"),  # a lock, control folder
    ("run/controldir.py", "os.O_RDWR | os.O_CREAT"),  # a lock, control folder
    # a safefile temporary file linked to the first free name
    ("agent/cudamemory.py", "os.link(tmp, path"),
    ("agent/cudamemory.py", 'open(fd, "wb")'),  # the descriptor of that safefile temporary file
}
_CREATING = re.compile(
    r"""(\.write_text\(|(?<!safefile)\.write_bytes\(|os\.replace\(|os\.rename\(|tempfile|os\.link\(|O_CREAT"""
    r"""|open\([^)]*["'](w|a|x|r\+)b?["'])"""
)


def test_every_file_is_created_through_safefile() -> None:
    # Issue 30: new, never through a link, under a name nobody can guess; one helper for all.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        if relative == "safefile.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _CREATING.search(code) and not any(
                relative == where and marker in code for where, marker in _CREATES_OUTSIDE_SAFEFILE
            ):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []


def test_no_module_over_800_lines() -> None:
    # Size was never the point, one concept per module is: a module past 600 lines is named (a
    # warning) so that a reviewer asks whether it holds more than one; past 800 it fails, and is
    # split by concern.
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
    }
    large = {name: n for name, n in sizes.items() if n > 600}
    if large:
        warnings.warn(f"modules past 600 lines (one concept each?): {large}", stacklevel=1)
    assert {name: n for name, n in large.items() if n > 800} == {}


def _product_modules() -> list[Path]:
    """Every module of the product (the bootstrap's sitecustomize is named by Python, not by us)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def test_module_names_are_unique() -> None:
    # Issue 50: a name says which module it is without its folder (three culprit.py were three
    # different things).
    seen: dict[str, list[str]] = {}
    for path in _product_modules():
        seen.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_class_names_are_unique() -> None:
    # Issue 50: one class per name across the package, so that `OpRow` in a traceback or a review
    # names one thing.
    seen: dict[str, list[str]] = {}
    for path in _product_modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_click_only_in_the_commands() -> None:
    # Issue 50: a command is found in one place, stepcli/commands/<name>.py (its options and a short
    # orchestration); cli.py holds the group and the error mapping. The work below them never parses
    # a command line.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "commands" or relative == Path("cli.py"):
            continue
        if any(name == "click" or name.startswith("click.") for name in _top_imports(path)):
            found.append(str(relative))
    assert found == []


def test_commands_import_nothing_of_the_group() -> None:
    # cli.py imports every command; a command that imported cli.py back would be a circle (`stepcli
    # demo` reaches `main` through the click context instead).
    assert [
        f"{m} -> {n}"
        for m, names in _package_imports("stepcli.commands").items()
        for n in names
        if n == "stepcli.cli"
    ] == []


def test_contributing_module_table_matches_the_tree() -> None:
    # Issue 50: CONTRIBUTING.md's package table is the one list of what owns what; it names every
    # top-level package and module of stepcli, and nothing that is gone.
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    table = text[text.index("| package | owns | may import |") :].split("\n\n", 1)[0]
    named = {
        name.strip("/").removesuffix(".py")
        for row in table.splitlines()[2:]
        for name in re.findall(r"`([^`]+)`", row.split("|")[1])
    }
    tree = {
        p.stem if p.suffix == ".py" else p.name
        for p in PACKAGE.iterdir()
        if (
            p.suffix == ".py"
            or (p.is_dir() and (p / "__init__.py").exists())
            or p.name == "_bootstrap"
        )
        and p.name not in ("__init__.py", "__main__.py")
    }
    assert sorted(named - tree) == [] and sorted(tree - named) == []
