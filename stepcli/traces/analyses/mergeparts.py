"""Many files' summaries as one: the per-file parts (stepcli.traces.analyses.results.FilePart) of
every rank merged into the tables, statistics, straggler and culprit `stepcli table` prints; the
parts are computed apart, in worker processes (stepcli.traces.engine), so only this runs over all of
them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepcli.stats import describe
from stepcli.traces.analyses.culprit import from_parts
from stepcli.traces.analyses.device import (
    DeviceTimes,
)
from stepcli.traces.analyses.flops import flops_figures
from stepcli.traces.analyses.pystacks import merge_stacks
from stepcli.traces.analyses.ranks import WindowFacts, find_straggler, group_processes, process_keys
from stepcli.traces.analyses.results import (
    NS_PER_MS,
    PHASES,
    Breakdown,
    FilePart,
    StepRow,
    TraceSummary,
)
from stepcli.traces.analyses.shares import share_basis
from stepcli.traces.analyses.steps import (
    Accumulator,
)
from stepcli.traces.analyses.traceanalysis import summarize_file

if TYPE_CHECKING:
    from stepcli.traces.read.tracereader import Trace


def summarize(traces: list[Trace], *, group_by_shape: bool = False) -> TraceSummary:
    """Summarize one or more traces (e.g. all ranks of a run) into the tables `stepcli table`
    prints."""
    return merge_parts(
        [summarize_file(t, group_by_shape=group_by_shape) for t in traces],
        group_by_shape=group_by_shape,
    )


def _add_rows(into: dict[Any, list[int]], rows: dict[Any, list[int]]) -> None:
    for key, (calls, self_ns, total_ns) in rows.items():
        row = into.get(key)
        if row is None:
            into[key] = [calls, self_ns, total_ns]
        else:
            row[0] += calls
            row[1] += self_ns
            row[2] += total_ns


def breakdown_of(parts: list[FilePart]) -> Breakdown | None:
    """The mean time per step in each phase over the parts' steps (merge_parts' `breakdown_ms`),
    alone: the page's bar per rank needs only this, not a whole merge (with its culprit and
    straggler) per rank."""
    phase_totals = dict.fromkeys(PHASES, 0)
    phase_steps = 0
    for part in parts:
        for label, ns in part.phase_totals.items():
            phase_totals[label] += ns
        phase_steps += part.phase_steps
    if not phase_steps:
        return None
    return Breakdown(**{label: ns / phase_steps / NS_PER_MS for label, ns in phase_totals.items()})


def merge_parts(parts: list[FilePart], *, group_by_shape: bool = False) -> TraceSummary:
    """The summary of several files from their parts (in file order), equal to summarizing them
    together."""
    cpu = Accumulator()
    device = Accumulator()
    steps: list[StepRow] = []
    windows: list[tuple[int | None, str, int | str | None, WindowFacts]] = []
    job_device: DeviceTimes | None = None
    flops = flops_steps = flops_ns = 0
    flops_devices: set[str] = set()
    flops_sources: set[str] = set()
    gemm_ns: dict[str, int] = {}
    rank_device: dict[str, DeviceTimes] = {}
    labels = process_keys([(part.rank, part.path, part.main_pid, part.steps) for part in parts])
    for part, (_key, process) in zip(parts, labels):
        _add_rows(cpu.rows, part.cpu_rows)
        _add_rows(device.rows, part.device_rows)
        trace_steps = [
            StepRow(rank=part.rank, step=step, dur_ms=ns / NS_PER_MS, process=process)
            for step, ns in zip(part.steps, part.step_ns)
        ]
        steps.extend(trace_steps)
        comm_ms = [ns / NS_PER_MS for ns in part.comm_ns]
        facts = WindowFacts(part.path, list(part.steps), [s.dur_ms for s in trace_steps], comm_ms)
        windows.append((part.rank, part.path, part.main_pid, facts))
        if part.flops is not None:
            flops += part.flops
            flops_steps += len(part.step_ns)
            flops_ns += sum(part.step_ns)
            flops_devices.add(part.flops_device or "")
            flops_sources.add(part.flops_source or "file")
            for dtype, ns in part.gemm_ns.items():
                gemm_ns[dtype] = gemm_ns.get(dtype, 0) + ns
        if part.device_times is not None:
            job_device = part.device_times if job_device is None else job_device + part.device_times
            mine = rank_device.get(process)
            rank_device[process] = part.device_times if mine is None else mine + part.device_times

    processes = group_processes(windows)
    order = {row.process: index for index, row in enumerate(processes)}
    steps.sort(key=lambda s: (order.get(s.process, 0), s.step))
    breakdown = breakdown_of(parts)
    step_ns = round(sum(s.dur_ms for s in steps) * NS_PER_MS)
    basis_ns, share_of = share_basis(step_ns, len(steps), cpu.self_ns_without_steps(group_by_shape))
    seen: dict[int, int] = {}
    for row in processes:
        if row.rank is not None:
            seen[row.rank] = seen.get(row.rank, 0) + 1
    repeated = {rank: count for rank, count in sorted(seen.items()) if count > 1}
    mixed = mixed_jobs_note(parts)
    # Several processes of one rank, or traces of jobs of different sizes: which rank waited for
    # which cannot be told; name nobody.
    straggler = None if repeated or mixed else find_straggler(processes)
    return TraceSummary(
        files=[p.path for p in parts],
        step_ms=describe(s.dur_ms for s in steps),
        steps=steps,
        ranks=processes,
        slowest_rank=straggler.rank if straggler else None,
        breakdown_ms=breakdown,
        device=job_device,
        rank_devices=rank_device,
        flops=(
            flops_figures(flops, flops_steps, flops_ns, flops_devices, flops_sources, gemm_ns)
            if flops_devices
            else None
        ),
        cpu_ops=cpu.rows_out(group_by_shape, basis_ns),
        device_kernels=device.rows_out(group_by_shape, basis_ns),
        events=sum(p.event_count for p in parts),
        skipped_events=sum(p.skipped_events for p in parts),
        share_of=share_of,
        straggler=straggler.to_dict() if straggler else None,
        outside_events=sum(p.outside_events for p in parts),
        outside_ms=sum(p.outside_ns for p in parts) / NS_PER_MS,
        culprit=None if repeated or mixed else from_parts(parts, steps),
        repeated_ranks=repeated,
        mixed_jobs=mixed,
        stub_steps=[(p.path, p.stub_step) for p in parts if p.stub_step is not None],
        other_ms=other_split(parts, breakdown),
        has_stacks=any(p.has_stacks for p in parts),
        has_shapes=any(p.shapes_recorded for p in parts),
        python_stacks=merge_stacks([p.stacks for p in parts])
        if any(p.stacks for p in parts)
        else None,
    )


def other_split(parts: Sequence[FilePart], breakdown: Breakdown | None) -> dict[str, float] | None:
    """The breakdown's "other" per step split into time outside every operator (Python, the
    profiler's own work) and time inside one no phase claims; None when a file's split is unknown
    (measured per window)."""
    if breakdown is None or any(p.phase_steps and p.other_inside_ns is None for p in parts):
        return None
    steps = sum(p.phase_steps for p in parts)
    inside = sum(p.other_inside_ns or 0 for p in parts) / steps / NS_PER_MS
    inside = min(inside, breakdown.other)
    return {"outside_operators": breakdown.other - inside, "inside_operators": inside}


def mixed_jobs_note(parts: Sequence[FilePart]) -> str | None:
    """The line saying that the traces come from jobs of different sizes (their
    distributedInfo.world_size), with their GPUs where those differ too; None when they agree or do
    not say."""
    names = [os.path.basename(part.path) for part in parts]
    # per-rank names repeat across runs' folders: name the folder too
    if len(set(names)) < len(names):
        names = [
            os.path.join(os.path.basename(os.path.dirname(part.path)), name)
            for part, name in zip(parts, names)
        ]
    sizes: dict[int, list[str]] = {}
    for part, name in zip(parts, names):
        if part.world_size is not None:
            sizes.setdefault(part.world_size, []).append(name)
    if len(sizes) < 2:
        return None
    each = ", ".join(
        f"{size} in {', '.join(files[:2])}{f' and {len(files) - 2} more' if len(files) > 2 else ''}"
        for size, files in sorted(sizes.items())
    )
    devices = sorted({part.device_name for part in parts if part.device_name})
    gpus = f"; GPUs {', '.join(devices)}" if len(devices) > 1 else ""
    return (
        f"traces of different jobs (world size {each}{gpus}): no slowest rank and no culprit is "
        f"named across them "
        "(summarize one job's traces for those)"
    )
