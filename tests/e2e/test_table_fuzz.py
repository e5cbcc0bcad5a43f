"""Fuzzing `table`, `table --json` and `compare` with seeded mutations of a real trace: bad input is
one line.

The trace comes from a tiny real torch.profiler run (once per session). Most mutants go through the
same entry point the `stepcli` command uses (`stepcli.cli.main`, which maps errors to exit codes) in
this process, for speed; a sample also runs as a real subprocess, where a traceback or a runaway
memory use would show for real.
"""

from __future__ import annotations

import gzip
import json
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_python, run_stepcli, write_script

SEED = 20251123
MUTANTS = 240
SUBPROCESS_SAMPLE = 6
SECONDS_PER_CALL = 10.0

_PROFILE = """
    import sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1)) as prof:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(sys.argv[1])
"""


@pytest.fixture(scope="session")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small trace written by plain torch.profiler (ProfilerStep#N, shapes, a few hundred
    events)."""
    folder = tmp_path_factory.mktemp("fuzz_source")
    script = write_script(folder, "profile_tiny.py", _PROFILE)
    path = folder / "tiny.pt.trace.json"
    proc = run_python(script, path)
    assert proc.returncode == 0, proc.stderr
    assert "ProfilerStep#" in path.read_text()
    return path


# Raw JSON tokens a structural mutation can put where a value goes (placeholders are swapped in
# after dumps).
_TOKENS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    str(2**64),
    str(-(2**64)),
    "1" + "0" * 5000,
    "null",
    "true",
    '"12.5"',
    '"abc"',
    '""',
    "[]",
    "{}",
    "[[[[[[[[]]]]]]]]",
    "-1",
    "-0.5",
    "0",
    "1e308",
    '"\\ud800"',
    '"ProfilerStep#' + "9" * 30 + '"',
    '"\xff"',
    "[" * 5000 + "]" * 5000,
]
_FIELDS = ["ts", "dur", "name", "cat", "ph", "pid", "tid", "args"]


def _structural(doc: dict[str, Any], rng: random.Random) -> bytes:
    """Replace, delete or retype fields of a few events or of the header, then serialize (maybe
    invalid JSON)."""
    doc = json.loads(json.dumps(doc))
    events = doc["traceEvents"]
    tokens: dict[str, str] = {}

    def token() -> str:
        key = f"@@TOKEN{len(tokens)}@@"
        tokens[key] = rng.choice(_TOKENS)
        return key

    kind = rng.randrange(8)
    if kind <= 3:  # odd values in some events
        for event in rng.sample(events, k=min(len(events), rng.randint(1, 20))):
            if isinstance(event, dict):
                event[rng.choice(_FIELDS)] = token()
    elif kind == 4:  # fields removed
        for event in rng.sample(events, k=min(len(events), rng.randint(1, 50))):
            if isinstance(event, dict):
                event.pop(rng.choice(_FIELDS), None)
    elif kind == 5:  # odd header values
        doc[
            rng.choice(
                [
                    "distributedInfo",
                    "stepcli_incomplete_step",
                    "traceEvents",
                    "schema",
                    "deviceProperties",
                ]
            )
        ] = {"rank": token()} if rng.random() < 0.5 else token()
    elif kind == 6:  # events that are not objects, duplicated or dropped
        for _ in range(rng.randint(1, 10)):
            events.insert(rng.randrange(len(events) + 1), token())
        del events[: rng.randrange(len(events))]
    else:  # the same odd value in every event's time (e.g. every dur negative)
        field, value = rng.choice(["ts", "dur"]), token()
        for event in events:
            if isinstance(event, dict) and field in event:
                event[field] = value
    text = json.dumps(doc)
    for key, raw in tokens.items():
        text = text.replace(f'"{key}"', raw)
    return text.encode("utf-8")


def _byte_level(data: bytes, rng: random.Random) -> bytes:
    """Flip, insert, delete, duplicate or cut bytes at random places."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        where = rng.randrange(len(buf) or 1)
        kind = rng.randrange(6)
        if kind == 0:
            buf[where : where + 1] = bytes([rng.randrange(256)])
        elif kind == 1:
            buf[where:where] = rng.choice(
                [b"\xff", b"\x00", b"{", b"[", b"]", b"}", b",", b'"', b"NaN", b"\\u", b"-"]
            )
        elif kind == 2:
            del buf[where : where + rng.randint(1, 200)]
        elif kind == 3:
            length = rng.randint(1, 400)
            buf[where:where] = buf[where : where + length]
        elif kind == 4:
            del buf[where:]
        else:
            buf[where : where + 1] = rng.choice([b"9" * 30, b"1e999", b"\xc3", b"\xed\xa0\x80"])
    return bytes(buf)


def _mutants(source: bytes, count: int) -> list[tuple[str, bytes]]:
    """(file name, content): structural and byte-level mutants, plain and gzipped (some corrupted
    after gzip)."""
    rng = random.Random(SEED)
    doc = json.loads(source)
    out: list[tuple[str, bytes]] = []
    for i in range(count):
        content = _structural(doc, rng) if i % 2 == 0 else _byte_level(source, rng)
        packing = rng.randrange(4)
        if packing == 0:
            out.append((f"m{i}.pt.trace.json.gz", gzip.compress(content, compresslevel=1)))
        elif packing == 1:
            out.append(
                (
                    f"m{i}.pt.trace.json.gz",
                    _byte_level(gzip.compress(content, compresslevel=1), rng),
                )
            )
        else:
            out.append((f"m{i}.pt.trace.json", content))
    return out


def _check(what: str, code: int, err: str, allowed: set[int]) -> None:
    assert code in allowed, f"{what}: exit {code}\n{err}"
    assert "internal error" not in err and "Traceback" not in err, f"{what}:\n{err}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stepcli: error: "), f"{what}:\n{err}"


def test_mutated_traces_never_crash_in_process(
    real_trace: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepcli.cli import main

    monkeypatch.delenv("STEPCLI_DEBUG", raising=False)
    # bounded, even for a gzip bomb
    monkeypatch.setenv("STEPCLI_MAX_INPUT_BYTES", str(64 * 1024 * 1024))
    baseline = tmp_path / "baseline.pt.trace.json"
    baseline.write_bytes(real_trace.read_bytes())
    commands: list[tuple[str, Callable[[str], list[str]], set[int]]] = [
        ("table", lambda p: ["table", p], {0, 2}),
        ("table --json", lambda p: ["table", "--json", p], {0, 2}),
        ("compare", lambda p: ["compare", str(baseline), p], {0, 1, 2, 3, 4}),
    ]
    codes: dict[int, int] = {}
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for name, content in _mutants(real_trace.read_bytes(), MUTANTS):
        path = tmp_path / name
        path.write_bytes(content)
        for label, argv, allowed in commands:
            started = time.monotonic()
            code = main(argv(str(path)))
            elapsed = time.monotonic() - started
            captured = capsys.readouterr()
            _check(f"{label} {name}", code, captured.err, allowed)
            assert elapsed < SECONDS_PER_CALL, f"{label} {name} took {elapsed:.1f} s"
            if label == "table --json" and code == 0:
                json.loads(captured.out)  # valid JSON, e.g. no integer past 64 bits
            codes[code] = codes.get(code, 0) + 1
        path.unlink()
    # The mutants really exercise both outcomes, and memory stayed bounded (ru_maxrss is in KiB on
    # Linux).
    assert codes.get(0, 0) > 50 and codes.get(2, 0) > 50, codes
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 512 * 1024


def test_mutated_traces_never_crash_as_a_subprocess(real_trace: Path, tmp_path: Path) -> None:
    # GIVEN a sample of the same mutants (every 37th: structural and byte-level, plain and gzipped)
    sample = _mutants(real_trace.read_bytes(), MUTANTS)[:: MUTANTS // SUBPROCESS_SAMPLE][
        :SUBPROCESS_SAMPLE
    ]
    for name, content in sample:
        path = tmp_path / name
        path.write_bytes(content)
        # WHEN the real command reads it
        proc = run_stepcli("table", "--json", path, timeout=60)
        # THEN a report or one line, never a traceback
        _check(f"table --json {name}", proc.returncode, proc.stderr, {0, 2})
        if proc.returncode == 0:
            json.loads(proc.stdout)
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 1024 * 1024  # KiB: under 1 GiB
