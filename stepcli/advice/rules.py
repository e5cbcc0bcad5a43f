"""Evidence-based advice: pure rules over numbers a run already measured, each naming its evidence
and threshold.

Every rule returns nothing unless its evidence crosses its threshold: no advice without numbers
behind it. The thresholds are module constants so tests can check both sides of each, and the report
can print them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepcli.advice.culpritadvice import culprit_advice
from stepcli.fmt import percent as _pct
from stepcli.runfolder.summaryfile import Advice, Threads
from stepcli.stats import percentile

# Data loading above this share of the step, and at least this long per step: the training loop
# waits for input. The floor keeps a tiny model's sub-millisecond in-process batching (the demo's)
# from calling for worker processes, whose start-up and IPC cost more than they would save.
DATALOADER_SHARE = 0.20
DATALOADER_MIN_MS = 5.0
# Launch-bound: the device idles at least this share of the step while the kernels it runs are this
# short on average and there are at least this many of them per step.
IDLE_SHARE = 0.40
SHORT_KERNEL_US = 20.0
MANY_KERNELS_PER_STEP = 50.0
# Host-device synchronisation: at least this many blocking calls per recorded step (only when
# kernels exist).
SYNCS_PER_STEP = 1.0
# Optimizer above this share of the step, updating parameters one tensor at a time: an
# optimizer-only in-place op (Adam's addcdiv_/lerp_, addcmul_) called at least this many times per
# step, and no foreach or fused op in sight.
OPTIMIZER_SHARE = 0.15
PER_TENSOR_CALLS = 20.0
PER_TENSOR_OPS = ("aten::addcdiv_", "aten::lerp_", "aten::addcmul_")
# Straggler: the slowest rank's mean step time at least this much above the median of the other
# ranks, and that rank the slowest in at least this share of the steps all ranks measured (at least
# STRAGGLER_MIN_STEPS of them).
STRAGGLER_RATIO = 1.10
STRAGGLER_CONSISTENCY = 0.75
STRAGGLER_MIN_STEPS = 10
# Threads: a host's processes run more intra-op threads (torch's pool: OMP_NUM_THREADS,
# torch.set_num_threads) than the cores they may use. Any excess counts: OpenMP threads spin while
# they wait, so an operator waits for a core (on 2 cores, 2 ranks x 2 threads ran their operators
# 8-10x slower than with OMP_NUM_THREADS=1).
THREADS_PER_CORE = 1.0
# Stalls: untouched steps (after start-up) slower than this multiple of their median, with enough
# steps to judge.
STALL_FACTOR = 3.0
STALL_MIN_STEPS = 20

# Runtime calls that make the host wait for the device. `.item()`, `.cpu()`, `.tolist()` and
# printing of device tensors end in one of these; aten::_local_scalar_dense alone is no evidence
# (optimizers call it on CPU tensors).
SYNC_NAMES = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventSynchronize",
)
# Frame and compile ids stay far below 10 digits; a longer number (any program can name a
# record_function so) is not torch.compile's, and int() of thousands of digits would raise.
_COMPILED_REGION = re.compile(r"Torch-Compiled Region: (\d{1,9})/(\d{1,9})(?!\d)")


@dataclass(frozen=True)
class Evidence:
    """The numbers the rules read. Every field may be missing; a rule without its evidence stays
    silent.

    `breakdown_ms` is the mean step breakdown (dataloader/forward/backward/optimizer/other);
    `cpu_ops` and `kernels` are operator rows (name, calls, self_ms) over `recorded_steps` steps;
    `rank_steps` maps each rank to its step times (the same steps for every rank); `untouched_ms`
    are (step, ms) outside recording windows, start-up step excluded.
    """

    breakdown_ms: Mapping[str, float] | None = None
    device_busy_share: float | None = None
    cpu_ops: Sequence[Mapping[str, Any]] = ()
    kernels: Sequence[Mapping[str, Any]] = ()
    recorded_steps: int = 0
    # rank -> step times, step-aligned
    rank_steps: Mapping[int, Sequence[float]] = field(default_factory=dict)
    # The straggler of stepcli.traces.analyses.ranks (its to_dict), when the ranks' traces were
    # analysed: then that is the one definition (None: nobody stands out), and step times, which
    # synchronous collectives make equal, are not.
    straggler: Mapping[str, Any] | None = None
    ranks_analysed: bool = False
    untouched_ms: Sequence[tuple[int, float]] = ()  # (step number, ms) of one process
    # the summary's `device` figures (stepcli.advice.deviceadvice reads them)
    device: Mapping[str, Any] | None = None
    # the `culprit` section (stepcli.run.summary.culpritsection)
    culprit: Mapping[str, Any] | None = None
    threads: Threads | None = None  # the `threads` section (stepcli.run.summary.threads)


def _share(breakdown: Mapping[str, float], key: str) -> float | None:
    total = sum(breakdown.values())
    return breakdown.get(key, 0.0) / total if total > 0 else None


def data_loading(ev: Evidence) -> Advice | None:
    """Input pipeline: the step spends a large share in `enumerate(DataLoader)`."""
    if not ev.breakdown_ms:
        return None
    share = _share(ev.breakdown_ms, "dataloader")
    if (
        share is None
        or share <= DATALOADER_SHARE
        or ev.breakdown_ms["dataloader"] < DATALOADER_MIN_MS
    ):
        return None
    return Advice(
        rule="data-loading",
        title="Data loading slows the step",
        evidence=f"data loading takes {_pct(share)} of the step "
        f"({ev.breakdown_ms['dataloader']:.2f} ms of {sum(ev.breakdown_ms.values()):.2f} ms)",
        threshold=f"> {_pct(DATALOADER_SHARE)} and >= {DATALOADER_MIN_MS:g} ms per step",
        suggestion="Load batches in background processes: DataLoader(num_workers=N, "
        "pin_memory=True, persistent_workers=True, prefetch_factor=2); move heavy per-sample work "
        "out of __getitem__.",
    )


def launch_bound(ev: Evidence) -> Advice | None:
    """The device idles between many short kernels: the CPU cannot launch them fast enough."""
    if ev.device_busy_share is None or not ev.kernels or ev.recorded_steps <= 0:
        return None
    calls = sum(int(k.get("calls", 0)) for k in ev.kernels)
    if calls <= 0:
        return None
    idle = 1.0 - ev.device_busy_share
    mean_us = sum(float(k.get("self_ms", 0.0)) for k in ev.kernels) * 1000.0 / calls
    per_step = calls / ev.recorded_steps
    if idle < IDLE_SHARE or mean_us > SHORT_KERNEL_US or per_step < MANY_KERNELS_PER_STEP:
        return None
    return Advice(
        rule="launch-bound",
        title="The device waits for kernel launches",
        evidence=f"the device is idle {_pct(idle)} of the step while running {per_step:.0f} "
        f"kernels per step of {mean_us:.1f} µs on average",
        threshold=f"idle ≥ {_pct(IDLE_SHARE)}, kernels ≤ {SHORT_KERNEL_US:.0f} µs, ≥ "
        f"{MANY_KERNELS_PER_STEP:.0f} per step",
        suggestion='Fuse small kernels with torch.compile (mode="reduce-overhead" adds CUDA '
        "graphs), capture the "
        "step in CUDA graphs, or raise the batch size so each kernel does more work.",
    )


def host_sync(ev: Evidence) -> Advice | None:
    """The host blocks on the device every step (`.item()`, `.cpu()`, explicit synchronize)."""
    if not ev.kernels or ev.recorded_steps <= 0:
        return None  # on a CPU-only run these calls wait for nothing
    counts = {
        str(op["name"]): int(op.get("calls", 0))
        for op in ev.cpu_ops
        if op.get("name") in SYNC_NAMES
    }
    total = sum(counts.values())
    per_step = total / ev.recorded_steps
    if per_step < SYNCS_PER_STEP:
        return None
    named = ", ".join(
        f"{name} ×{calls}" for name, calls in sorted(counts.items(), key=lambda kv: -kv[1]) if calls
    )
    return Advice(
        rule="host-sync",
        title="The host waits for the device every step",
        evidence=f"{per_step:.1f} synchronizing calls per recorded step ({named})",
        threshold=f"≥ {SYNCS_PER_STEP:g} per step",
        suggestion="Avoid .item(), .cpu(), .tolist() and printing device tensors inside the loop: "
        "accumulate metrics on the device and read them every N steps; use non_blocking=True "
        "copies.",
    )


def slow_optimizer(ev: Evidence) -> Advice | None:
    """A large optimizer share with a per-tensor (neither foreach nor fused) implementation over
    many tensors."""
    if not ev.breakdown_ms or ev.recorded_steps <= 0:
        return None
    share = _share(ev.breakdown_ms, "optimizer")
    if share is None or share <= OPTIMIZER_SHARE:
        return None
    names = [str(op.get("name", "")) for op in (*ev.cpu_ops, *ev.kernels)]
    if any(
        "_foreach_" in n or "_fused_" in n or re.search(r"fused_?(adam|sgd|adagrad)", n, re.I)
        for n in names
    ):
        return None
    per_tensor = {
        str(op["name"]): int(op.get("calls", 0)) / ev.recorded_steps
        for op in ev.cpu_ops
        if op.get("name") in PER_TENSOR_OPS
    }
    if not per_tensor or max(per_tensor.values()) < PER_TENSOR_CALLS:
        return None
    name, per_step = max(per_tensor.items(), key=lambda kv: kv[1])
    return Advice(
        rule="optimizer",
        title="The optimizer updates one tensor at a time",
        evidence=f"the optimizer takes {_pct(share)} of the step and {name} runs {per_step:.0f} "
        f"times per step, "
        "with no foreach/fused optimizer ops",
        threshold=f"> {_pct(OPTIMIZER_SHARE)} of the step, ≥ {PER_TENSOR_CALLS:.0f} per-tensor "
        f"calls per step",
        suggestion="Construct the optimizer with foreach=True, or fused=True where supported "
        "(Adam, AdamW, SGD on CUDA), so it updates all parameters in a few kernels instead of one "
        "loop per parameter.",
    )


def recompilations(ev: Evidence) -> Advice | None:
    """torch.compile regions that were compiled more than once."""
    compiles: dict[str, set[int]] = {}
    for op in ev.cpu_ops:
        match = _COMPILED_REGION.search(str(op.get("name", "")))
        if match:
            compiles.setdefault(match.group(1), set()).add(int(match.group(2)))
    recompiled = {frame: ids for frame, ids in compiles.items() if max(ids) >= 1}
    if not recompiled:
        return None
    detail = ", ".join(
        f"frame {frame}: {max(ids) + 1} compilations" for frame, ids in sorted(recompiled.items())
    )
    return Advice(
        rule="recompile",
        title="torch.compile recompiled",
        evidence=f"compiled regions with a recompilation ran in the recorded steps ({detail})",
        threshold="any frame compiled more than once",
        suggestion="Run with TORCH_LOGS=recompiles to see which guard failed; keep shapes and "
        "Python values fed to the compiled function stable, or mark varying dimensions with "
        "torch._dynamo.mark_dynamic.",
    )


def straggler(ev: Evidence) -> Advice | None:
    """One rank's steps take longer than the others', step after step (by compute per step when
    traces say)."""
    if ev.ranks_analysed:
        return _traced_straggler(ev.straggler)
    if len(ev.rank_steps) < 2:
        return None
    common = min(len(times) for times in ev.rank_steps.values())
    if common < STRAGGLER_MIN_STEPS:
        return None
    means = {rank: sum(times[:common]) / common for rank, times in ev.rank_steps.items()}
    slowest = max(sorted(means), key=lambda r: means[r])
    typical = percentile(sorted(v for r, v in means.items() if r != slowest), 50)
    if typical <= 0:
        return None
    ratio = means[slowest] / typical
    ranks = sorted(ev.rank_steps)
    slowest_in = (
        sum(1 for i in range(common) if max(ranks, key=lambda r: ev.rank_steps[r][i]) == slowest)
        / common
    )
    if ratio < STRAGGLER_RATIO or slowest_in < STRAGGLER_CONSISTENCY:
        return None
    return Advice(
        rule="straggler",
        title=f"Rank {slowest} is slower than the others",
        evidence=f"rank {slowest} averages {means[slowest]:.2f} ms per step, {ratio:.2f}× the "
        f"other ranks' median of {typical:.2f} ms, and is the slowest in {_pct(slowest_in)} of "
        f"{common} steps",
        threshold=f"≥ {STRAGGLER_RATIO:.2f}× and slowest in ≥ {_pct(STRAGGLER_CONSISTENCY)} of ≥ "
        f"{STRAGGLER_MIN_STEPS} steps",
        suggestion="Compare that rank's trace with another's (stepcli table on both): uneven data "
        "shards or sequence lengths, a slower or shared device, or extra work on that rank "
        "(logging, checkpoints).",
    )


def _traced_straggler(found: Mapping[str, Any] | None) -> Advice | None:
    if not found:
        return None
    return Advice(
        rule="straggler",
        title=f"Rank {found['rank']} is slower than the others",
        evidence=str(found["evidence"]),
        threshold=str(found.get("threshold") or ""),
        suggestion="Compare that rank's trace with another's (stepcli table on both): uneven data "
        "shards or sequence lengths, a slower or shared device, or extra work on that rank "
        "(logging, checkpoints).",
    )


def stalls(ev: Evidence) -> Advice | None:
    """Occasional steps much slower than the typical step (outside the recording windows)."""
    values = [ms for _, ms in ev.untouched_ms]
    if len(values) < STALL_MIN_STEPS:
        return None
    median = percentile(sorted(values), 50)
    if median <= 0:
        return None
    slow = [(step, ms) for step, ms in ev.untouched_ms if ms > STALL_FACTOR * median]
    if not slow:
        return None
    worst_step, worst = max(slow, key=lambda sv: sv[1])
    return Advice(
        rule="stalls",
        title="Some steps stall",
        evidence=f"{len(slow)} of {len(values)} untouched steps took over {STALL_FACTOR:g}× the "
        f"median of {median:.2f} ms (worst {worst:.1f} ms, about step {worst_step})",
        threshold=f"> {STALL_FACTOR:g}× median",
        suggestion="Look at what runs on those steps: evaluation, checkpointing, logging, garbage "
        "collection (gc.freeze() after set-up), a DataLoader refilling its workers at an epoch "
        "boundary. Record one with --skip-first to see inside it.",
    )


def threads(ev: Evidence) -> Advice | None:
    """More intra-op threads than cores on a host (the summary's `threads` section): operators wait
    for a core."""
    every = ev.threads.hosts if ev.threads else []
    hosts = [host for host in every if host.intra_op_threads > THREADS_PER_CORE * host.cores]
    if not hosts:
        return None
    worst = max(hosts, key=lambda host: host.intra_op_threads / host.cores)
    processes, cores = worst.processes, worst.cores
    each = worst.per_process[0] if len(worst.per_process) == 1 else None
    per = f"{processes} processes x {each} intra-op threads" if each and processes > 1 else None
    counted = (
        f"{per} = {worst.intra_op_threads}" if per else f"{worst.intra_op_threads} intra-op threads"
    )
    where = f" on host {worst.host}" if len(every) > 1 else ""
    fit = max(1, cores // processes)
    return Advice(
        rule="threads",
        title="More CPU threads than cores",
        evidence=f"{counted} on {cores} core{'s' if cores != 1 else ''} stepcli sees{where}: "
        f"operators wait for a "
        "core (OpenMP threads spin while they wait)",
        threshold=f"intra-op threads of a host's processes > {THREADS_PER_CORE:g}× its cores",
        suggestion=f"Give each process {fit} thread{'s' if fit != 1 else ''}: "
        f"OMP_NUM_THREADS={fit} in the environment (torchrun sets 1 only when it is unset), or "
        f"torch.set_num_threads({fit}) at the start of "
        "each process; or run fewer processes per host.",
    )


def culprit(ev: Evidence) -> Advice | None:
    """A rank the others wait for at collectives, with the cause of its lateness
    (stepcli.run.summary.culpritsection)."""
    fields = culprit_advice(ev.culprit)
    return Advice(**fields) if fields else None


RULES: tuple[Callable[[Evidence], Advice | None], ...] = (
    data_loading,
    launch_bound,
    host_sync,
    slow_optimizer,
    recompilations,
    straggler,
    culprit,
    threads,
    stalls,
)


def advise(evidence: Evidence) -> list[Advice]:
    """Every rule whose evidence crosses its threshold, in a stable order."""
    return [advice for rule in RULES if (advice := rule(evidence)) is not None]
