"""`stepcli demo`: a small training script shipped with stepcli, so a new user sees the whole flow
at once."""

from __future__ import annotations

from pathlib import Path

DEMO_SCRIPT = Path(__file__).resolve().parent / "train.py"


def demo_argv() -> list[str]:
    """What `stepcli demo` runs after the user's run options: the bundled script."""
    return [str(DEMO_SCRIPT)]


def demo_help() -> int:
    """`stepcli demo -- --help`: the demo script's own options, printed by the script itself (it
    reads them before importing torch), run without stepcli: asking for help starts no run and
    writes no run folder."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(DEMO_SCRIPT), "--help"], check=False).returncode
