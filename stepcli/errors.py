"""The one error family stepcli reports to users: a single line and an exit code."""

from __future__ import annotations

# Exit codes shared by every command (compare follows diff(1): 0 same, 1 different, 2 trouble).
EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_NOTHING_MEASURED = 3
EXIT_INCONCLUSIVE = 4  # compare --strict: the interval was too wide to decide
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in stepcli itself
# EX_IOERR: run's --json could not be written (a full disk): no summary is left at its path
EXIT_NOT_SAVED = 74
# `--on-hang kill`: the job was ended after its hang dump (timeout(1)'s status for "timed out")
EXIT_HANG = 124


class StepcliError(Exception):
    """A problem stepcli explains in one line instead of a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class TraceError(StepcliError):
    """A trace file that is missing, empty, truncated, not JSON, or not a profiler trace."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}", EXIT_USAGE)
        self.path = path
        self.problem = problem
