"""The result types of trace analysis: what `stepcli table` reports (TraceSummary and its rows), and
what one file contributes to it (FilePart), the small picklable part that worker processes send
back.

Definitions of the figures are in stepcli.traces.analyses.traceanalysis (and
docs/commands/table.md); this module holds data only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from stepcli.stats import Stats
from stepcli.traces.analyses.arrivals import RankArrivals
from stepcli.traces.analyses.device import DeviceTimes
from stepcli.traces.analyses.ranks import ProcessRow

# Step phases, from the annotations torch writes. The order is the priority when phases overlap in
# time.
PHASES = ("dataloader", "optimizer", "backward", "forward", "other")
NS_PER_MS = 1_000_000.0


@dataclass(frozen=True)
class OpRow:
    """One operator (or kernel) name, aggregated over every call in every trace, like a
    key_averages() row."""

    name: str
    calls: int
    self_ms: float
    total_ms: float
    avg_ms: float
    self_share: float
    shape: str | None = None

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": self.name,
            "calls": self.calls,
            "self_ms": self.self_ms,
            "total_ms": self.total_ms,
            "avg_ms": self.avg_ms,
            "self_share": self.self_share,
        }
        if self.shape is not None:
            row["shape"] = self.shape
        return row


@dataclass(frozen=True)
class StepRow:
    """The duration of one ProfilerStep#N annotation of one process (`process`: its rank or worker
    label)."""

    rank: int | None
    step: int
    dur_ms: float
    process: str = "-"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "process": self.process,
            "step": self.step,
            "dur_ms": self.dur_ms,
        }


@dataclass(frozen=True)
class Breakdown:
    """Mean milliseconds per step spent in each phase; the five add up to the mean step time."""

    dataloader: float
    forward: float
    backward: float
    optimizer: float
    other: float

    def to_dict(self) -> dict[str, float]:
        return {
            "dataloader": self.dataloader,
            "forward": self.forward,
            "backward": self.backward,
            "optimizer": self.optimizer,
            "other": self.other,
        }


STUB_WHY = "the profiler's closing stub, with none of the program's work in it"


@dataclass(frozen=True)
class TraceSummary:
    """Everything `stepcli table` reports; `to_dict()` is the JSON contract other commands read
    back."""

    files: list[str]
    step_ms: Stats | None
    steps: list[StepRow]
    ranks: list[ProcessRow]
    # the straggler by compute (stepcli.traces.analyses.ranks), not the longest step time
    slowest_rank: int | None
    breakdown_ms: Breakdown | None
    # device time by kernel class over the recorded steps (stepcli.traces.analyses.device)
    device: DeviceTimes | None
    cpu_ops: list[OpRow]
    device_kernels: list[OpRow]
    events: int
    # events left out because their ts/dur was infinite, NaN or absurdly large
    skipped_events: int = 0
    # what every self_share is a share of (stepcli.traces.analyses.shares)
    share_of: str = "recorded step time"
    straggler: dict[str, Any] | None = None  # the evidence behind slowest_rank
    # host operator calls outside every recorded step, left out of cpu_ops (module docstring)
    outside_events: int = 0
    outside_ms: float = 0.0  # their self time
    # per process label (ranks[].process)
    rank_devices: dict[str, DeviceTimes] = field(default_factory=dict)
    flops: dict[str, Any] | None = (
        None  # FLOPs per step, FLOP/s, MFU (stepcli.traces.analyses.flops); None without counts
    )
    culprit: dict[str, Any] | None = (
        None  # the rank the others wait for at collectives (stepcli.traces.analyses.culprit)
    )
    # rank -> processes, for ranks seen in several (several runs in one folder, a restarted job): no
    # straggler and no culprit is named then, since no job's ranks can be told from another's
    repeated_ranks: dict[int, int] = field(default_factory=dict)
    # traces of jobs of different sizes (mergeparts.mixed_jobs_note): nobody named
    mixed_jobs: str | None = None
    # per file with one, the profiler's closing stub step left out of every figure
    # (analysis.profiler_stub)
    stub_steps: list[tuple[str, int]] = field(default_factory=list)
    # of the breakdown's "other", ms per step outside every operator and inside one no phase claims;
    # None unknown
    other_ms: dict[str, float] | None = None
    has_stacks: bool = False  # some trace holds Python frames (recorded with stacks)
    has_shapes: bool = False  # some trace holds input shapes (recorded with shapes)
    # `table --stacks` (stepcli.traces.analyses.pystacks.merge_stacks)
    python_stacks: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": list(self.files),
            "step_ms": self.step_ms,
            "steps": [s.to_dict() for s in self.steps],
            "ranks": [self._rank_dict(r) for r in self.ranks],
            "slowest_rank": self.slowest_rank,
            "breakdown_ms": self.breakdown_ms.to_dict() if self.breakdown_ms else None,
            "device": self.device.to_dict() | (self.flops or {}) if self.device else None,
            "cpu_ops": [r.to_dict() for r in self.cpu_ops],
            "device_kernels": [r.to_dict() for r in self.device_kernels],
            "events": self.events,
            "skipped_events": self.skipped_events,
            "share_of": self.share_of,
            "straggler": self.straggler,
            "outside_steps": {"events": self.outside_events, "self_ms": self.outside_ms},
            "flops": self.flops,
            "culprit": self.culprit,
            "repeated_ranks": {str(rank): count for rank, count in self.repeated_ranks.items()},
            "mixed_jobs": self.mixed_jobs,
            "left_out_steps": [
                {"file": path, "step": step, "why": STUB_WHY} for path, step in self.stub_steps
            ],
            "other_ms": self.other_ms,
            "recorded_with": {"stacks": self.has_stacks, "shapes": self.has_shapes},
            "python_stacks": self.python_stacks,
        }

    def _rank_dict(self, row: ProcessRow) -> dict[str, Any]:
        device = self.rank_devices.get(row.process)
        return {**row.to_dict(), "device": device.to_dict() if device else None}


@dataclass
class FilePart:
    """What one trace file contributes to a summary: small (per-name sums, per-step figures),
    picklable, and merged exactly (integer nanoseconds), so files can be summarized in worker
    processes and only these travel back."""

    path: str
    rank: int | None
    event_count: int
    skipped_events: int
    cpu_rows: dict[Any, list[int]]
    device_rows: dict[Any, list[int]]
    main_pid: int | str | None
    steps: list[int]  # complete steps, ordered
    step_ns: list[int]
    comm_ns: list[int]
    phase_totals: dict[str, int]
    phase_steps: int
    # device time by kernel class over the steps, None without device work
    device_times: DeviceTimes | None
    has_shapes: bool = False
    outside_events: int = 0  # host operator calls outside every step of their process, in no row
    outside_ns: int = 0
    # the window's FLOPs written beside the trace (stepcli.traces.analyses.flops), if any
    flops: int | None = None
    flops_device: str | None = None
    flops_source: str | None = None  # "file" (NAME.flops) or "trace" (operators' args.flops)
    # GEMM/convolution kernel time in the recorded steps by the dtype their names say, for MFU's
    # peak (with FLOPs)
    gemm_ns: dict[str, int] = field(default_factory=dict)
    # its collectives, for the culprit (stepcli.traces.analyses.culprit)
    arrivals: RankArrivals | None = None
    world_size: int | None = None  # its job's size, as the trace says (distributedInfo.world_size)
    # its steps' thread as a lane of `stepcli whatif`'s graph
    # (stepcli.traces.analyses.lanes.RankLane), when the read asked for it (the run's end does: its
    # summary says what would help, from the same read)
    lane: Any = None
    device_name: str | None = None  # its first GPU (deviceProperties)
    # the N of the profiler's closing stub left out (analysis.profiler_stub), if any
    stub_step: int | None = None
    # of phase_totals["other"], inside an operator (steps.TraceResult)
    other_inside_ns: int | None = None
    has_stacks: bool = False  # it holds Python frames (stepcli.traces.analyses.pystacks.has_stacks)
    # it holds input shapes: read ones, or GEMMs' input types (decoded on every read, shapes or not)
    shapes_recorded: bool = False
    stacks: Any = None  # its Python stacks (pystacks.StackPart), when the read asked for them


class TraceFacts(Protocol):
    """What a read trace says of itself besides its events (stepcli.traces.read.tracereader.Trace,
    columnkeeper.ColumnTrace)."""

    @property
    def path(self) -> str: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def event_count(self) -> int: ...
    @property
    def skipped_events(self) -> int: ...
    @property
    def incomplete_step(self) -> int | None: ...
    @property
    def device_name(self) -> str | None: ...
    @property
    def clock(self) -> str | None: ...
    @property
    def cpu_time(self) -> dict[int, tuple[float, float]] | None: ...
    @property
    def world_size(self) -> int | None: ...
