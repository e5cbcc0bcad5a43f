"""`stepcli demo`: a small training script shipped with stepcli, so a new user sees the whole flow at once."""

from __future__ import annotations

from pathlib import Path

DEMO_SCRIPT = Path(__file__).resolve().parent / "train.py"


def demo_argv() -> list[str]:
    """What `stepcli demo` runs after the user's run options: the bundled script."""
    return [str(DEMO_SCRIPT)]
