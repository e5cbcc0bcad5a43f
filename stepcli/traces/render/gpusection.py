"""The terminal's GPU section of `stepcli table` and the run summary: device time by class per rank
(and for the job), idle by cause and launch statistics, in 80 columns (the figures:
stepcli.traces.analyses.device, .launches)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stepcli.fmt import us

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_COLUMNS = (  # (header, field, kind): share of step time, or milliseconds per step
    ("compute", "compute_share", "pct"),
    ("comm", "comm_share", "pct"),
    ("overlap", "comm_overlap_share", "pct"),
    ("exposed", "exposed_comm_ms", "ms"),
    ("memory", "memory_share", "pct"),
    ("idle", "idle_share", "pct"),
    ("host wait", "host_wait_ms", "ms"),
)


def _cell(device: Mapping[str, Any], field: str, kind: str) -> str:
    value = device["idle_by_cause"][field] if field == "host_wait_ms" else device.get(field)
    if value is None:
        return "-"
    if kind == "pct":
        return f"{value * 100:.1f}%"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def device_table(
    device: Mapping[str, Any], ranks: Sequence[Mapping[str, Any]] = (), whole: bool = False
) -> Table:
    """One row for the job, and one per rank when there are several: shares of recorded step time,
    except `exposed` (communication with no computation beside it) and `host wait` (idle waiting for
    the host), in ms per step; `overlap` is the share of communication time with computation beside
    it. `whole`: a trace without steps, its figures for the whole trace."""
    from rich.table import Table

    title = (
        "Device time, whole trace (no recorded step)"
        if whole
        else "Device time per step (recorded steps)"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("process", max_width=12, overflow="ellipsis", no_wrap=True)
    for header, _field, _kind in _COLUMNS:
        table.add_column(header, justify="right")
    with_device = [r for r in ranks if r.get("device")]
    rows: list[tuple[str, Mapping[str, Any]]] = [("job", device)]
    if len(with_device) > 1:
        rows += [(str(r["process"]), r["device"]) for r in with_device]
    for label, figures in rows:
        table.add_row(label, *(_cell(figures, field, kind) for _header, field, kind in _COLUMNS))
    table.caption = (
        "% of the trace's time; exposed comm (no compute beside it), host wait: ms; overlap: % of "
        "comm"
        if whole
        else "% of step time; exposed comm (no compute beside it), host wait: ms/step; overlap: % "
        "of comm"
    )
    table.caption_justify = "left"
    return table


def launch_line(device: Mapping[str, Any], whole: bool = False) -> str | None:
    """One line of launch statistics and idle causes, or None without launches linked to their
    kernels. `whole`: a trace without steps, counted over the whole trace."""
    launch = device.get("launch")
    if not launch:
        return None
    delay = launch["delay_us"]
    idle = device["idle_by_cause"]
    per = "" if whole else "/step"
    text = (
        f"launches: {launch['kernels_per_step']:,.0f} kernels{per}, delay p50 {us(delay['p50'])} "
        f"p90 {us(delay['p90'])}, {launch['cpu_launch_us_per_kernel']:.1f} µs CPU per kernel, "
        f"{launch['short_kernel_share'] * 100:.0f}% shorter than their launch"
    )
    if launch["graph_replays_per_step"]:
        text += (
            f", {_per_step(launch['graph_replays_per_step'])} graph replays{per}"
            f" ({_per_step(launch['graph_kernels_per_step'])} kernels)"
        )
    text += (
        f"; idle: host wait {idle['host_wait_ms']:.2f}, kernel wait {idle['kernel_wait_ms']:.2f}, "
        f"other {idle['other_ms']:.2f} ms{per}"
    )
    return text


def _per_step(value: float) -> str:
    """A per-step mean as people read it: 3, 0.63, 1.5, 266 (never 0.631579 or 1e+03)."""
    if value >= 10 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 1 else f"{value:.1f}"


def flops_line(flops: Mapping[str, Any] | None) -> str | None:
    """FLOPs per step, achieved FLOP/s and MFU (with --with-flops), at the pace they were taken at,
    or None without counts."""
    if not flops or flops.get("flops_per_step") is None:
        return None
    text = f"FLOPs: {flops['flops_per_step']:.3g} per step"
    if flops.get("achieved_flops_per_s") is not None:
        text += f", {flops['achieved_flops_per_s'] / 1e12:.3g} TFLOP/s achieved"
    if flops.get("mfu") is not None:
        dtype = str(flops.get("mfu_dtype") or "bf16").upper()
        assumed = (
            " (dtype assumed)" if flops.get("mfu_dtype_assumed") else " (dtype of its GEMM kernels)"
        )
        text += f", MFU {flops['mfu']:.1%} of {flops['device_name']}'s dense {dtype} peak{assumed}"
    return text + pace_text(flops)


def pace_text(flops: Mapping[str, Any]) -> str:
    """Which steps' pace achieved FLOP/s and MFU are taken at: the untouched steps' (the program's
    own, the recorded steps' figures then follow), or the recorded steps' (the profiler's cost
    included); '' without a rate."""
    if flops.get("achieved_flops_per_s") is None:
        return ""
    step_ms = flops.get("pace_step_ms")
    if flops.get("pace") != "untouched":
        return ", at the recorded steps' pace (the profiler's cost included)"
    text = ", at the untouched steps' pace" + (
        f" (median step {step_ms:.3g} ms)" if step_ms else ""
    )
    recorded = flops.get("achieved_flops_per_s_recorded")
    if recorded is not None:
        text += f"; at the recorded steps' pace {recorded / 1e12:.3g} TFLOP/s"
        if flops.get("mfu_recorded") is not None:
            text += f", MFU {flops['mfu_recorded']:.1%}"
    return text


def print_device_section(data: Mapping[str, Any], console: Console, whole: bool = False) -> None:
    """The GPU section, when the traces have device work (as the `device` of a summary or run
    summary), and the FLOPs line when there are counts."""
    line = flops_line(data.get("flops"))
    if line:
        console.print(line, highlight=False, markup=False)
    device = data.get("device")
    if not device or "compute_share" not in device:
        return
    console.print(device_table(device, data.get("ranks") or (), whole))
    line = launch_line(device, whole)
    if line:
        console.print(line, highlight=False, markup=False, soft_wrap=False)
