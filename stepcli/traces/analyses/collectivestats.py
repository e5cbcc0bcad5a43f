"""Collectives and host-device copies over the recorded steps: per collective type and size, calls,
time, algorithm and bus bandwidth (nccl-tests' formulas); per copy direction and host memory
(pageable or pinned), bandwidth.

A device event counts when it starts inside a recorded step. A collective's type, algorithm and
protocol come from its kernel name (`ncclKernel_AllReduce_RING_LL_Sum_float`,
`ncclDevKernel_AllGather_RING_LL`, `rccl...`), its size from the NCCL metadata torch records in the
kernel's args (`Collective name`, `In msg nelems`, `Out msg nelems`, `Group size`, `dtype`) when the
trace has them. Bandwidths (docs/concepts/gpu.md, "Collectives and copies"): algbw = size / mean
time; busbw = algbw x factor with n ranks: all-reduce 2(n-1)/n; all-gather, reduce-scatter and
all-to-all (n-1)/n; broadcast, reduce, send/recv 1 (nccl-tests' PERFORMANCE.md); size is the larger
of the input and output message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from stepcli.traces.read.typedcolumns import Columns

_ALGORITHMS = (
    "RING",
    "TREE",
    "COLLNET",
    "COLLNETDIRECT",
    "COLLNETCHAIN",
    "NVLS",
    "NVLSTREE",
    "PAT",
)
_PROTOCOLS = ("LL", "LL128", "SIMPLE")
_KERNEL = re.compile(r"^(?:void )?[nr]ccl[A-Za-z]*_([A-Za-z]+)", re.IGNORECASE)
_COPY = re.compile(r"^Memcpy (\w+)(?: \((\w+) -> (\w+)\))?")
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "uint32": 4,
    "half": 2, "float16": 2, "f16": 2, "bfloat16": 2, "bf16": 2, "short": 2, "int16": 2,
    "double": 8, "float64": 8, "f64": 8, "long": 8, "int64": 8, "uint64": 8,
    "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
NS_PER_MS = 1_000_000.0


def collective_of(
    name: str, args: tuple[int, str, int, int, int, str] | None
) -> tuple[str, str, str] | None:
    """(type, algorithm, protocol) of a collective kernel; None for any other kernel."""
    match = _KERNEL.match(name)
    if match is None:
        return None
    tokens = set(name.split("(")[0].upper().split("_"))
    algorithm = next((a for a in _ALGORITHMS if a in tokens), "")
    protocol = next((p for p in _PROTOCOLS if p in tokens), "")
    kind = args[1] if args and args[1] else match.group(1)
    return kind.lower().replace("_", ""), algorithm, protocol


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor of a collective over `ranks` ranks."""
    n = max(ranks, 1)
    if kind in ("allreduce",):
        return 2 * (n - 1) / n
    if kind in (
        "allgather",
        "reducescatter",
        "alltoall",
        "alltoallv",
        "allgatherbase",
        "reducescatterbase",
    ):
        return (n - 1) / n
    return 1.0


@dataclass
class Transfers:
    """Per key, [calls, ns, bytes] summed over the steps of a file (or of several: `+` adds
    them)."""

    steps: int
    collectives: dict[tuple[str, str, str, str, int, int], list[int]] = field(default_factory=dict)
    copies: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def __add__(self, other: Transfers) -> Transfers:
        total = Transfers(self.steps + other.steps)
        for mine, theirs, into in (
            (self.collectives, other.collectives, total.collectives),
            (self.copies, other.copies, total.copies),
        ):
            for table in (mine, theirs):
                for key, values in table.items():
                    row = into.setdefault(key, [0, 0, 0])  # type: ignore[arg-type]
                    for i, value in enumerate(values):
                        row[i] += value
        return total

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        steps = max(self.steps, 1)
        collectives = []
        for (kind, algorithm, protocol, dtype, size, ranks), (calls, ns, _bytes) in sorted(
            self.collectives.items(), key=lambda item: -item[1][1]
        ):
            algbw = size * calls / ns if size > 0 and ns else None  # bytes per ns = GB/s
            collectives.append(
                {
                    "collective": kind,
                    "algorithm": algorithm or None,
                    "protocol": protocol or None,
                    "dtype": dtype or None,
                    "bytes": size if size > 0 else None,
                    "ranks": ranks if ranks > 0 else None,
                    "calls_per_step": calls / steps,
                    "ms_per_step": ns / steps / NS_PER_MS,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * bus_factor(kind, ranks)
                    if algbw is not None and ranks > 0
                    else None,
                }
            )
        copies = [
            {
                "copy": direction,
                "host_memory": memory or None,
                "calls_per_step": calls / steps,
                "ms_per_step": ns / steps / NS_PER_MS,
                "bytes_per_step": size / steps if size >= 0 else None,
                "gbps": size / ns if ns and size > 0 else None,
            }
            for (direction, memory), (calls, ns, size) in sorted(
                self.copies.items(), key=lambda item: -item[1][1]
            )
        ]
        return {"collectives": collectives, "copies": copies}


def _copy_of(name: str) -> tuple[str, str] | None:
    """(direction, host memory) of a copy: ("HtoD", "Pageable") for `Memcpy HtoD (Pageable ->
    Device)`."""
    match = _COPY.match(name)
    if match is None:
        return None
    direction, source, dest = match.groups()
    host = source if direction.startswith("H") else dest if direction.endswith("H") else ""
    return direction, host or ""


def measure_transfers(
    columns: Columns,
    start: np.ndarray,
    dur: np.ndarray,
    device: np.ndarray,
    inside: np.ndarray,
    steps: int,
) -> Transfers:
    """The transfers of the device events `device` (indices) whose `inside` (bool per device event)
    is true."""
    import numpy as np

    out = Transfers(steps)
    names, transfers = columns.names, columns.transfers
    # per name: 1 a copy, 2 a collective kernel, 0 anything else (once per distinct name, then
    # arrays)
    kinds = np.array([_kind_of(n) for n in names] or [0], np.int8)
    chosen = device[inside]
    chosen = chosen[kinds[columns.name[chosen]] > 0]
    for at in chosen.tolist():
        name = names[int(columns.name[at])]
        args = transfers.get(at)
        ns = int(dur[at])
        copy = _copy_of(name)
        if copy is not None:
            row = out.copies.setdefault(copy, [0, 0, 0])
            row[0] += 1
            row[1] += ns
            row[2] += args[0] if args and args[0] > 0 else 0
            continue
        kind, algorithm, protocol = collective_of(name, args) or ("", "", "")
        size, ranks, dtype = _size_of(args)
        row = out.collectives.setdefault((kind, algorithm, protocol, dtype, size, ranks), [0, 0, 0])
        row[0] += 1
        row[1] += ns
        row[2] += max(size, 0)
    return out


def _kind_of(name: str) -> int:
    if name.startswith("Memcpy") and _COPY.match(name):
        return 1
    return 2 if _KERNEL.match(name) else 0


def _size_of(args: tuple[int, str, int, int, int, str] | None) -> tuple[int, int, str]:
    """(message bytes or -1, ranks or -1, dtype) from a collective's metadata."""
    if not args:
        return -1, -1, ""
    _bytes, _name, in_nelems, out_nelems, group, dtype = args
    width = _DTYPE_BYTES.get(dtype.lower().replace("torch.", ""), 0)
    nelems = max(in_nelems, out_nelems)
    return (nelems * width if width and nelems > 0 else -1), group, dtype
