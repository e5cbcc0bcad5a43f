"""The command examples of README.md and docs/: found, classified, and checked, so that
documentation cannot drift.

Three kinds of fenced block (```lang) hold commands:

- ``console``: a session, run for real. Lines starting `$ ` are commands, run in order in one
  scratch folder per page (later commands see what earlier ones wrote); the lines after each, up to
  the next `$ `, are what it prints (stdout and stderr together). Each shown line must appear, in
  order, among the printed lines, after masking what changes from run to run (numbers, sizes, times,
  run ids, the scratch folder); a line `...` stands for any lines and is there only to say so. A
  last line `[exit N]` says the command exits N (else 0).
- ``sh`` / ``bash`` / ``shell``: commands to copy. Every `stepcli ...` line is parsed by stepcli's
  own command-line parser (click), without running: an unknown option, a missing argument or a bad
  value fails the test.
- ``text``: synopses and sample output, never run (nothing in them is a command to copy).
- `` `stepcli ...` `` in prose: parsed like a copy-me command.

A block preceded by `<!-- illustrative: REASON -->` is not run or parsed (a GPU, a cluster, a
running job); the reason is required and such blocks are counted, so that the marking stays rare.
README's indented (four-space) blocks count as ``sh`` blocks.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)\s*$")
ILLUSTRATIVE = re.compile(r"<!--\s*illustrative:\s*(?P<reason>\S.*?)\s*-->")
EXIT = re.compile(r"^\[exit (?P<code>\d+)\]$")
INLINE = re.compile(r"`(stepcli [^`]+)`")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the block's first content line
    lang: str
    lines: list[str]
    illustrative: str | None = None  # the reason, when marked


@dataclass
class Step:
    """One `$ command` of a console block and what it is shown to print."""

    command: str
    shown: list[str] = field(default_factory=list)
    exit_code: int = 0
    line: int = 0


def doc_files() -> list[Path]:
    docs = sorted((REPO / "docs").rglob("*.md")) if (REPO / "docs").is_dir() else []
    return [REPO / "README.md", *docs]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, and its indented blocks as `sh` (README's older
    style)."""
    text = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    pending_reason: str | None = None
    previous_blank = True
    while i < len(text):
        line = text[i]
        mark = ILLUSTRATIVE.search(line)
        if mark:
            pending_reason = mark.group("reason")
            i += 1
            continue
        opened = FENCE.match(line)
        if opened:
            fence = opened.group("fence")
            body: list[str] = []
            j = i + 1
            while j < len(text) and not text[j].strip().startswith(fence):
                body.append(text[j][len(opened.group("indent")) :])
                j += 1
            found.append(Block(path, i + 2, opened.group("lang") or "text", body, pending_reason))
            pending_reason, i, previous_blank = None, j + 1, False
            continue
        if previous_blank and line.startswith("    ") and line.strip():
            body, j = [], i
            while j < len(text) and (text[j].startswith("    ") or not text[j].strip()):
                body.append(text[j][4:])
                j += 1
            while body and not body[-1].strip():
                body.pop()
            found.append(Block(path, i + 1, "sh", body, pending_reason))
            pending_reason, i, previous_blank = None, j, False
            continue
        inline = INLINE.findall(line)
        if inline:  # `stepcli ...` in prose: copied as often as the blocks are
            found.append(Block(path, i + 1, "inline", inline))
        if line.strip():
            pending_reason = None if not line.lstrip().startswith("<!--") else pending_reason
        previous_blank = not line.strip()
        i += 1
    return found


def sessions(block: Block) -> list[Step]:
    """The steps of a console block."""
    steps: list[Step] = []
    for offset, line in enumerate(block.lines):
        if line.startswith("$ "):
            steps.append(Step(line[2:].strip(), line=block.line + offset))
        elif steps:
            code = EXIT.match(line.strip())
            if code:
                steps[-1].exit_code = int(code.group("code"))
            elif line.strip():
                steps[-1].shown.append(line.rstrip())
    return steps


def stepcli_lines(block: Block) -> list[tuple[int, list[str]]]:
    """(line, argv after `stepcli`) of each `stepcli` command in a copy-me block, continuation lines
    joined, comments and the shell's own syntax (pipes, redirections, `&&`) cut off at the first of
    them."""
    commands: list[tuple[int, list[str]]] = []
    joined, start = "", 0
    for offset, raw in enumerate(block.lines):
        line = raw.rstrip()
        if not joined:
            start = block.line + offset
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        command, joined = joined.strip(), ""
        for part in re.split(r"\s(?:&&|\|\||;)\s", command):
            part = part.strip()
            if part.startswith("$ "):
                part = part[2:]
            if not part.startswith("stepcli "):
                continue
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                words = part.split()
            for stop, word in enumerate(words):
                if word in ("|", ">", ">>", "2>", "2>&1", "<"):
                    words = words[:stop]
                    break
            commands.append((start, words[1:]))
    return commands


# What changes from run to run; each becomes one token on both sides before comparing.
_MASKS = (
    (re.compile(r"\b\d{8}-\d{6}-[\w.-]+-\d+\b"), "<RUN>"),  # run ids
    (re.compile(r"[0-9a-f]{32}"), "<ID>"),
    (re.compile(r"\d+(?:[.,]\d+)*"), "<N>"),  # numbers: counts, times, sizes, ratios
    # a quantity, whatever its unit
    (re.compile(r"<N>\s*(?:ns|µs|us|ms|s|min|h|B|KiB|MiB|GiB|TiB)\b"), "<Q>"),
    (re.compile(r"\s+"), " "),
)


def mask(line: str, scratch: Path | None = None) -> str:
    if scratch is not None:
        line = line.replace(str(scratch) + "/", "").replace(str(scratch), ".")
    for pattern, token in _MASKS:
        line = pattern.sub(token, line)
    return line.strip()


def shown_lines_match(shown: list[str], printed: str, scratch: Path) -> str | None:
    """None when every shown line appears, in order, among the printed ones (after masking); else
    the first shown line that does not."""
    lines = [mask(line, scratch) for line in printed.splitlines()]
    at = 0
    for line in shown:
        if line.strip() == "...":
            continue
        wanted = mask(line)
        while at < len(lines) and lines[at] != wanted:
            at += 1
        if at == len(lines):
            return line
        at += 1
    return None
