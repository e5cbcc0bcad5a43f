"""The traces of one run end, read at most once.

After `stepcli run`, the run summary (stepcli.run.summary.build) and report.html
(stepcli.report.data) need the same traces: the summary their plain per-file parts, the page those
parts, the by-shape parts and the memory curves. Both ask one `RunTraces`, which reads every file
once (with shapes when a page will follow) and hands the same parts to both, so a torchrun job's
large per-rank traces are decoded once, not once per consumer. `stepcli report PATH` makes its own
`RunTraces` and reads the files once too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stepcli.errors import StepcliError

if TYPE_CHECKING:
    from stepcli.traces.analyses.results import FilePart, TraceSummary

MemoryCurves = list[tuple[str, list[tuple[float, float]]]]


class RunTraces:
    """Per-file parts (stepcli.traces.analyses.results.FilePart) and memory curves of a list of
    traces, read on first demand and kept for the next caller that asks about the same files.

    `shapes`: read `Input Dims` on the first read even if the first caller needs only plain parts,
    because a later one (the page) will want by-shape parts. `memory`: whether the traces can hold
    `[memory]` events at all (torch writes them only with profile_memory); False answers no curves
    without opening a file.
    """

    def __init__(
        self,
        *,
        shapes: bool = True,
        memory: bool = True,
        jobs: int | None = None,
        lanes: bool = False,
    ) -> None:
        self.shapes = shapes
        # each file's what-if lane too (FilePart.lane), for the run summary's `what_would_help`
        self.lanes = lanes
        self.memory = memory
        self.jobs = jobs
        self._key: tuple[str, ...] | None = None
        self._shaped = False
        self._parts: list[list[FilePart]] = []
        self._problem: StepcliError | None = None
        self._curves: dict[tuple[str, ...], MemoryCurves] = {}
        self._summary: TraceSummary | None = None

    def parts(self, paths: Sequence[str], *, shapes: bool = False) -> list[list[FilePart]]:
        """Per file: its plain part, then its by-shape part when the files were read with shapes
        (always when `shapes` is asked). Raises the reader's StepcliError (TraceError) again to
        every caller, as reading again would."""
        key = tuple(str(p) for p in paths)
        if key != self._key or (shapes and not self._shaped):
            self._read(key, shapes or self.shapes)
        if self._problem is not None:
            raise self._problem
        return self._parts

    def summary(self, paths: Sequence[str]) -> TraceSummary:
        """The files' plain parts merged (stepcli.traces.analyses.mergeparts), once: the run
        summary, the page's advice and the page all show it, and at 1,024 ranks one merge (its
        culprit alignment) takes seconds. Callers take `.to_dict()` of it, each their own copy.
        Raises as `parts` does."""
        parts = self.parts(paths)
        if self._summary is None:
            from stepcli.traces.analyses.mergeparts import merge_parts

            self._summary = merge_parts([p[0] for p in parts])
        return self._summary

    def _read(self, key: tuple[str, ...], shapes: bool) -> None:
        from stepcli.traces.engine import file_parts

        self._key, self._shaped, self._parts, self._problem = None, False, [], None
        self._summary = None
        groupings = (False, True) if shapes else (False,)
        try:
            # Python stacks too: the page's flame graph (nothing is computed for traces without
            # them)
            self._parts = file_parts(
                list(key),
                groupings=groupings,
                shapes=shapes,
                jobs=self.jobs,
                lanes=self.lanes,
                stacks=True,
            )
        except StepcliError as exc:
            self._problem = exc
        # Anything else is a bug: nothing is kept, so the next caller reads again and meets it on
        # its own.
        self._key, self._shaped = key, shapes

    def memory_curves(self, paths: Sequence[str]) -> MemoryCurves:
        """Allocated-memory curves of the traces that have `[memory]` events
        (stepcli.traces.memorycurve)."""
        if not self.memory:
            return []
        key = tuple(str(p) for p in paths)
        if key not in self._curves:
            from stepcli.traces.memorycurve import memory_curves

            self._curves[key] = memory_curves(key, self.jobs)
        return self._curves[key]
