"""One trace's device figures, for the file summary
(stepcli.traces.analyses.traceanalysis.summarize_columns): its FLOPs and GEMM time by dtype (an
undtyped kernel takes its operator's through `External id`), its launches, copies and collectives,
and the device time inside its recorded steps, each with array operations over the columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepcli.traces.analyses.collectivestats import Transfers, measure_transfers
from stepcli.traces.analyses.device import (
    measure_steps,
    within_arrays,
)
from stepcli.traces.analyses.flops import read_flops
from stepcli.traces.analyses.launches import LaunchTimes, in_spans, measure_launches
from stepcli.traces.analyses.steps import (
    TraceResult,
    Window,
    measured_spans,
    within_lists,
)
from stepcli.traces.read.names import DTYPES, gemm_dtype

if TYPE_CHECKING:
    from stepcli.traces.read.typedcolumns import Columns


def flops_of(
    path: str, columns: Columns, result: TraceResult, windows: list[Window], device: str | None
) -> dict[str, Any]:
    """The FLOPs of a trace: from the `NAME.flops` file `stepcli run --with-flops` writes beside it,
    else the sum of the `flops` torch wrote into its operators' args, over the operators that start
    inside a complete recorded step of their process (all of them in a trace without steps)."""
    counted = read_flops(path)
    if counted:
        figures = {
            "flops": counted[0],
            "flops_device": counted[1] or device,
            "flops_source": "file",
        }
        return figures | gemm_time(columns, result)
    if not columns.flops:
        return {}
    import numpy as np

    at = np.fromiter(columns.flops, np.int64, len(columns.flops))
    flops = np.fromiter(columns.flops.values(), np.int64, len(columns.flops))
    if windows:
        ns = result.nanoseconds
        # times past 64-bit ns (the reference path): microseconds, as floats, are precise enough to
        # place an op
        start = ns.start[at] if ns is not None else columns.ts[at] * 1000.0
        pid = (
            np.array(columns.ids, dtype=object)[columns.pid[at]]
            if columns.ids
            else np.zeros(len(at), object)
        )
        inside = np.zeros(len(at), bool)
        for process in {w.pid for w in windows}:
            mine = [w for w in windows if w.pid == process]
            lo = np.array(sorted(w.start for w in mine), np.float64 if ns is None else np.int64)
            hi = np.array([w.end for w in sorted(mine, key=lambda w: w.start)], lo.dtype)
            inside |= (pid == process) & in_spans(start, lo, hi)
        flops = flops[inside]
    counted_flops = sum(flops.tolist())  # (no int64 overflow)
    return {
        "flops": counted_flops,
        "flops_device": device,
        "flops_source": "trace",
        **gemm_time(columns, result),
    }


def gemm_time(columns: Columns, result: TraceResult) -> dict[str, Any]:
    """`gemm_ns`: the time of the GEMM and convolution kernels that start inside the recorded steps
    (the measured spans), by the dtype their names say (stepcli.traces.analyses.flops.gemm_dtype,
    once per unique kernel name); empty without device work, with no kernel recognised, and for
    times past 64-bit nanoseconds."""
    if not result.device_union:
        return {}
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    ns = result.nanoseconds
    if ns is None:
        try:
            ns = col.nanoseconds(columns)
        except col.TooLarge:
            return {}
    kernels = np.nonzero(columns.kind == typedcolumns.DEVICE)[0]
    used = np.unique(columns.name[kernels])
    # len(DTYPES): not a recognised GEMM
    code = np.full(len(columns.names) or 1, len(DTYPES), np.int64)
    for name in used.tolist():
        dtype = gemm_dtype(columns.names[name])
        if dtype is not None:
            code[name] = DTYPES.index(dtype)
    spans = measured_spans(result)
    lo = np.array([s for s, _ in spans], np.int64)
    hi = np.array([e for _, e in spans], np.int64)
    kernels = kernels[in_spans(ns.start[kernels], lo, hi)]
    codes = code[columns.name[kernels]]
    if columns.gemm_kernels and columns.gemm_ops:
        _operator_dtypes(columns, kernels, codes)
    times = np.bincount(codes, weights=ns.dur[kernels], minlength=len(DTYPES) + 1)
    gemm_ns = {dtype: int(times[i]) for i, dtype in enumerate(DTYPES) if times[i] > 0}
    return {"gemm_ns": gemm_ns} if gemm_ns else {}


def _operator_dtypes(columns: Columns, kernels: Any, codes: Any) -> None:
    """Give the GEMM kernels among `kernels` whose names say no dtype (cuBLAS 12.8+'s nvjet_*) the
    dtype of the operator that launched them, matched by `External id` (a kernel's is its innermost
    operator's), in `codes`; only these few kernels and operators are looked at."""
    import numpy as np

    rows = np.fromiter(columns.gemm_kernels, np.int64, len(columns.gemm_kernels))
    externals = np.fromiter(columns.gemm_kernels.values(), np.int64, len(rows))
    at = np.searchsorted(kernels, rows)
    mine = (
        (at < len(kernels)) & (kernels[np.minimum(at, len(kernels) - 1)] == rows)
        if len(kernels)
        else at < 0
    )
    if not mine.any():
        return
    dtype_of = {external: DTYPES.index(dtype) for external, dtype in columns.gemm_ops.values()}
    unknown = len(DTYPES)
    codes[at[mine]] = [dtype_of.get(external, unknown) for external in externals[mine].tolist()]


def device_launches(
    columns: Columns,
    result: TraceResult,
    spans: list[tuple[int, int]],
    steps: int,
    windows: list[Window],
) -> tuple[LaunchTimes, Transfers, list[tuple[int, ...]]]:
    """Launch statistics and idle time by cause (stepcli.traces.analyses.launches), collectives and
    copies (stepcli.traces.analyses.collectivestats), on either path's result; and the device
    figures of each step window (stepcli.traces.analyses.device.measure_steps); none for times past
    64-bit nanoseconds."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns

    ns = result.nanoseconds
    if ns is None:
        try:
            ns = col.nanoseconds(columns)
        except col.TooLarge:
            return LaunchTimes(steps=steps), Transfers(steps), []
    device = np.nonzero(columns.kind >= typedcolumns.DEVICE)[0]
    lo = np.array([s for s, _ in spans], np.int64)
    hi = np.array([e for _, e in spans], np.int64)
    inside = in_spans(ns.start[device], lo, hi)
    transfers = measure_transfers(columns, ns.start, ns.dur, device, inside, steps)
    w_lo = np.array([w.start for w in windows], np.int64)
    w_hi = np.array([w.end for w in windows], np.int64)
    launches, waits = measure_launches(
        columns, ns.start, ns.dur, device, spans, steps, (w_lo, w_hi)
    )
    per_step: list[tuple[int, ...]] = []
    if windows and result.device_classes is not None:
        arrays = result.device_arrays is not None
        per_step = measure_steps(
            [w.step for w in windows],
            w_lo,
            w_hi,
            result.device_arrays if arrays else result.device_union,
            result.device_classes,
            waits,
            within_arrays if arrays else within_lists,
        )
    return launches, transfers, per_step


def device_busy_arrays(result: TraceResult) -> tuple[int, int] | None:
    """`device_busy` with array operations: the device time inside each span is F(end) - F(start),
    where F(t) is the device union's length before t (prefix sums and a binary search), instead of a
    Python step per kernel interval."""
    if not result.device_union:
        return None
    import numpy as np

    merged = measured_spans(result)
    if result.device_arrays is not None:
        starts, ends = result.device_arrays
    else:
        pairs = np.array(result.device_union, dtype=np.int64)
        starts, ends = pairs[:, 0], pairs[:, 1]
    return within_arrays((starts, ends), merged), sum(e - s for s, e in merged)
