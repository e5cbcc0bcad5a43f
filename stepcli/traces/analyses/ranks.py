"""Processes, ranks and the straggler: one home for grouping traces and naming the slow rank.

Several traces can come from one process (`--repeat 0` windows, a program's own repeated profiler):
they are grouped by process first (its rank, else the `<host>_<pid>` worker of its file name, else
the trace's OS pid), and its windows are listed inside, labelled by their steps. Step numbers of
different processes are never merged.

Under synchronous collectives every rank's step takes the same time; the slow rank is the one that
waits least. So each step is split into communication wait (collective operators and kernels: c10d,
gloo, NCCL) and compute (the rest), and the straggler is the rank whose compute per step stands out
from the others' median.

This is the one definition of "the slowest rank": the terminal, `--json` (`slowest_rank`,
`straggler`), report.html and the advice all show what `find_straggler` returns, and nothing when it
returns None. Communication is not a clean measure of waiting (gloo runs DDP's all-reduce on its own
thread, overlapping the backward pass, and that counts as communication), so no rank is named
without evidence: at least STRAGGLER_MIN_STEPS steps that every rank recorded, the rank computing
more than the others' median in most of them (STRAGGLER_CONSISTENCY), by more than the step-to-step
noise (the mean of the per-step differences over NOISE_SE standard errors) and by a share of the
step that matters (STRAGGLER_MIN_SHARE), besides the factor and floor below. A balanced run names
nobody.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stepcli.stats import Stats, describe

T = TypeVar("T")
_WORKER = re.compile(r"^(.+?)\.\d+\.pt\.trace\.json(\.gz)?$")
# Names of CPU events and device kernels that are collective communication (or waiting for it).
_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms", "ncclKernel", "ncclDevKernel")
# A rank is a straggler when its compute per step exceeds the others' median by this factor ...
STRAGGLER_FACTOR = 1.25
# ... and by at least this many milliseconds (noise on tiny steps is not a straggler) ...
STRAGGLER_MIN_MS = 0.02
# ... over at least this many steps every rank recorded, computing more than the others' median in
# at least this share of them, the mean per-step difference above this many standard errors of it.
STRAGGLER_MIN_STEPS = 10
STRAGGLER_CONSISTENCY = 0.75
NOISE_SE = 3.0
# ... and by at least this share of its step time: a rank that holds the others back by less is not
# worth naming (on a shared machine one rank is often descheduled a little more than another).
STRAGGLER_MIN_SHARE = 0.25


def is_communication(name: str) -> bool:
    """Whether an event is collective communication: its time on a rank is mostly waiting for the
    others."""
    return name.startswith(_COMM_PREFIXES) or "nccl" in name[:16].lower()


def process_key(rank: int | None, path: str, pid: int | str | None) -> tuple[str, str]:
    """(sort key, label) of the process a trace came from."""
    if rank is not None:
        return f"0:{rank:09d}", f"rank {rank}"
    match = _WORKER.match(os.path.basename(path))
    if match:
        return f"1:{match.group(1)}", match.group(1)
    if pid is not None:
        return f"2:{pid}", f"pid {pid}"
    return f"3:{path}", os.path.basename(path)


def process_keys(
    items: Sequence[tuple[int | None, str, int | str | None, Sequence[int]]],
) -> list[tuple[str, str]]:
    """`process_key` of every trace, (rank, path, pid, its step numbers) each. Two runs into one
    folder (`-o` given twice), or a restarted rank, stay apart, never one process whose step 2 is
    two runs' step 2:

    - one rank seen with several OS pids is several processes, `rank 0 (pid N)`;
    - traces that would be one process but hold the same step (rankless runs in containers, where
      every program is PID 1 on a host of the same name) are told apart by time: taken in the order
      their file names' clock says (tensorboard_trace_handler's `<worker>.<ns>.pt.trace.json`), each
      trace joins the run it continues: of the process's runs whose steps all came before its own,
      the one a trace joined last (runs follow each other in time: run A's steps 2-4, then run B's
      2-4 and 7-9, make B 2-4 and 7-9, not A 2-4 and 7-9). The runs are labelled `vm_1 #1`, `vm_1
      #2`. (Two profiler sessions of one process, each counting from 0, look the same and are shown
      the same way.)"""
    pids: dict[int, set[int | str]] = {}
    for rank, _path, pid, _steps in items:
        if rank is not None and pid is not None:
            pids.setdefault(rank, set()).add(pid)
    out = []
    for rank, path, pid, _steps in items:
        key, label = process_key(rank, path, pid)
        if rank is not None and pid is not None and len(pids.get(rank, ())) > 1:
            key, label = f"{key}:{pid}", f"{label} (pid {pid})"
        out.append((key, label))
    return _split_reused(out, [(path, steps) for _rank, path, _pid, steps in items])


_CLOCK = re.compile(r"\.(\d+)\.pt\.trace\.json(?:\.gz)?$")


def _split_reused(
    keys: list[tuple[str, str]], traces: list[tuple[str, Sequence[int]]]
) -> list[tuple[str, str]]:
    """`keys` with each process whose traces repeat a step number split into runs (see
    process_keys)."""
    by_key: dict[str, list[int]] = {}
    for index, (key, _label) in enumerate(keys):
        by_key.setdefault(key, []).append(index)
    out = list(keys)
    for key, indexes in by_key.items():
        if len(indexes) < 2:
            continue
        counted = sum(len(set(traces[i][1])) for i in indexes)
        if len(set().union(*(traces[i][1] for i in indexes))) == counted:
            continue  # no step twice: one process
        runs: list[tuple[int, list[int]]] = []  # (last step, trace indexes) per run
        latest: list[int] = []  # the runs, the one a trace joined last at the end
        for i in sorted(indexes, key=lambda i: (_clock_of(traces[i][0]), i)):
            steps = traces[i][1]
            first, last = (min(steps), max(steps)) if steps else (None, None)
            # runs follow each other in time: the latest one it can continue
            for n in reversed(latest):
                run_last, members = runs[n]
                if first is None or first > run_last:
                    members.append(i)
                    runs[n] = (max(run_last, last if last is not None else run_last), members)
                    latest.remove(n)
                    break
            else:
                n = len(runs)
                runs.append((last if last is not None else -1, [i]))
            latest.append(n)
        for n, (_last, members) in enumerate(runs, 1):
            for i in members:
                out[i] = (f"{key}#{n:06d}", f"{keys[i][1]} #{n}")
    return out


def _clock_of(path: str) -> int:
    found = _CLOCK.search(os.path.basename(path))
    return int(found.group(1)) if found else 0


def steps_label(steps: list[int]) -> str:
    """`steps 3-5` for a window; `steps 3, 7` when they are not consecutive; `no steps`."""
    if not steps:
        return "no steps"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))


def first_per_process(rows: Sequence[T], limit: int | None, process: Callable[[T], str]) -> list[T]:
    """The first `limit` rows of each process (every row without a limit), in their order: a cut
    table shows every process, not the first process's steps alone."""
    if limit is None:
        return list(rows)
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        key = process(row)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= limit:
            out.append(row)
    return out


@dataclass
class WindowFacts:
    """One trace file of one process: its complete steps, their durations and their communication
    wait (ms)."""

    file: str
    steps: list[int]
    dur_ms: list[float]
    comm_ms: list[float]


@dataclass
class ProcessRow:
    """One process (rank): statistics over all its windows' steps, and the windows themselves."""

    process: str
    rank: int | None
    windows: list[WindowFacts] = field(default_factory=list)

    @property
    def step_ms(self) -> Stats | None:
        return describe(d for w in self.windows for d in w.dur_ms)

    @property
    def comm_ms(self) -> float | None:
        """Mean communication wait per step."""
        values = [c for w in self.windows for c in w.comm_ms]
        return sum(values) / len(values) if values else None

    @property
    def compute_ms(self) -> float | None:
        """Mean time per step outside communication."""
        values = [d - c for w in self.windows for d, c in zip(w.dur_ms, w.comm_ms)]
        return sum(values) / len(values) if values else None

    def compute_by_step(self) -> dict[int, float]:
        """Time outside communication of each recorded step, by step number."""
        return {s: d - c for w in self.windows for s, d, c in zip(w.steps, w.dur_ms, w.comm_ms)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "rank": self.rank,
            "file": self.windows[0].file if self.windows else None,
            "files": [w.file for w in self.windows],
            "windows": [
                {"file": w.file, "steps": steps_label(w.steps), "step_ms": describe(w.dur_ms)}
                for w in self.windows
            ],
            "step_ms": self.step_ms,
            "compute_ms": self.compute_ms,
            "comm_ms": self.comm_ms,
        }


def group_processes(
    items: list[tuple[int | None, str, int | str | None, WindowFacts]],
) -> list[ProcessRow]:
    """(rank, path, pid, window) of every trace -> one row per process, in rank order, windows by
    first step."""
    rows: dict[str, ProcessRow] = {}
    keys = process_keys([(rank, path, pid, window.steps) for rank, path, pid, window in items])
    for (rank, _path, _pid, window), (key, label) in zip(items, keys):
        rows.setdefault(key, ProcessRow(label, rank)).windows.append(window)
    out = [rows[key] for key in sorted(rows)]
    for row in out:
        row.windows.sort(key=lambda w: (w.steps[0] if w.steps else -1, w.file))
    return out


@dataclass(frozen=True)
class Straggler:
    """The rank that holds the others back, and the evidence for it."""

    rank: int
    compute_ms: float
    others_median_ms: float
    others_wait_ms: float | None
    steps: int = 0  # steps every rank recorded
    # of those, the steps in which this rank computed more than the others' median
    ahead_in: int = 0

    @property
    def evidence(self) -> str:
        text = (
            f"rank {self.rank}: compute {self.compute_ms:.3g} ms/step vs median "
            f"{self.others_median_ms:.3g} ms of the other ranks, more in {self.ahead_in} of "
            f"{self.steps} common steps"
        )
        if self.others_wait_ms:
            text += f"; the others wait {self.others_wait_ms:.3g} ms/step in collectives for it"
        return text

    @property
    def threshold(self) -> str:
        return (
            f"≥ {STRAGGLER_FACTOR:.2f}× the others' median compute and ≥ {STRAGGLER_MIN_SHARE:.0%} "
            f"of the step more, more in ≥ {STRAGGLER_CONSISTENCY:.0%} of ≥ {STRAGGLER_MIN_STEPS} "
            f"common steps, beyond {NOISE_SE:g} standard errors of the step-to-step noise"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "compute_ms": self.compute_ms,
            "others_median_compute_ms": self.others_median_ms,
            "others_wait_ms": self.others_wait_ms,
            "steps": self.steps,
            "ahead_in": self.ahead_in,
            "evidence": self.evidence,
            "threshold": self.threshold,
        }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def find_straggler(rows: list[ProcessRow]) -> Straggler | None:
    """The rank whose compute per step stands out from the others', with evidence (module
    docstring), or None."""
    ranked = [r for r in rows if r.rank is not None and r.compute_ms is not None]
    if len(ranked) < 2:
        return None
    by_step = {r.rank: r.compute_by_step() for r in ranked}
    common = sorted(set.intersection(*(set(steps) for steps in by_step.values())))
    if len(common) < STRAGGLER_MIN_STEPS:
        return None
    means = {rank: sum(by_step[rank][s] for s in common) / len(common) for rank in by_step}
    # any rank's
    durations = {s: d for r in ranked for w in r.windows for s, d in zip(w.steps, w.dur_ms)}
    step_ms = sum(durations[s] for s in common) / len(common)
    rank = max(sorted(means, key=lambda r: r or 0), key=lambda r: means[r])
    others = [r for r in by_step if r != rank]
    # Per step: this rank's compute minus the others' median that step (ranks that step together are
    # paired).
    diffs = [by_step[rank][s] - _median([by_step[o][s] for o in others]) for s in common]
    median = _median([means[o] for o in others])
    mean_diff = sum(diffs) / len(diffs)
    spread = math.sqrt(sum((d - mean_diff) ** 2 for d in diffs) / (len(diffs) - 1))
    ahead = sum(1 for d in diffs if d > 0)
    if (
        means[rank] < median * STRAGGLER_FACTOR
        or means[rank] - median < max(STRAGGLER_MIN_MS, STRAGGLER_MIN_SHARE * step_ms)
        or ahead < STRAGGLER_CONSISTENCY * len(common)
        or mean_diff <= NOISE_SE * spread / math.sqrt(len(diffs))
    ):
        return None
    waits = [w for r in ranked if r.rank != rank and (w := r.comm_ms) is not None]
    assert rank is not None
    return Straggler(
        rank, means[rank], median, _median(waits) if waits else None, len(common), ahead
    )
