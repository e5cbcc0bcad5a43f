"""Synthetic NCCL-style traces of 4 ranks in two kinds of process groups, as torch >= 2.2 writes
them: each collective is a `c10d::allreduce_` with a nested `record_param_comms` whose args name its
process group, the group's ranks and its sequence number on the group, and an NCCL kernel on its
group's own stream, launched by a `cudaLaunchKernel` inside the collective (the same `correlation`)
and carrying the group but no `Seq`, as Kineto copies it.

Tensor-parallel groups {0, 1} ("1") and {2, 3} ("2"), data-parallel groups {0, 2} ("3") and {1, 3}
("4"). Each 100 ms step: 5 ms of aten::mm, a TP all-reduce, then a DP all-reduce 0.5 ms after the TP
one is done. Rank r arrives r x 10 µs after the others (no exact ties); `late_rank` idles `late_us`
before its TP all-reduce. A collective ends 1 ms after its last member arrives. So rank 3 (late 30
ms) holds back rank 2 at TP group "2", and, leaving it late, rank 1 at DP group "4"; rank 2,
released late, holds back rank 0 at DP group "3". Matched by (step, name, order) over all ranks
instead, the TP all-reduces of the two TP groups are taken for one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STEPS = 6
TP = {"1": (0, 1), "2": (2, 3)}
DP = {"3": (0, 2), "4": (1, 3)}
SEQ_BASE = 40  # the window starts mid-run: the groups' sequence numbers do not start at 0


def group_of(rank: int, groups: dict[str, tuple[int, ...]]) -> tuple[str, tuple[int, ...]]:
    return next((name, ranks) for name, ranks in groups.items() if rank in ranks)


def _times(
    late_rank: int, late_us: float, dp_first: bool = False
) -> dict[int, list[tuple[float, ...]]]:
    """Per rank, per step: (TP arrival, TP departure, DP arrival, DP departure), µs from the step's
    start.

    dp_first: the DP all-reduce comes first, rank r arriving (3 - r) x 5 µs after the others, then
    the TP one 0.5 ms after it is done (+ r x 10 µs): the late rank is last at its TP all-reduces
    only, half its collectives."""
    late = {r: late_us if r == late_rank else 0.0 for r in range(4)}
    if dp_first:
        dp_arrive = {r: 5_200.0 + 5 * (3 - r) for r in range(4)}
        dp_depart = {r: max(dp_arrive[m] for m in group_of(r, DP)[1]) + 1_000.0 for r in range(4)}
        tp_arrive = {r: dp_depart[r] + 500.0 + 10 * r + late[r] for r in range(4)}
        tp_depart = {r: max(tp_arrive[m] for m in group_of(r, TP)[1]) + 1_000.0 for r in range(4)}
    else:
        tp_arrive = {r: 5_200.0 + 10 * r + late[r] for r in range(4)}
        tp_depart = {r: max(tp_arrive[m] for m in group_of(r, TP)[1]) + 1_000.0 for r in range(4)}
        dp_arrive = {r: tp_depart[r] + 500.0 + 10 * r for r in range(4)}
        dp_depart = {r: max(dp_arrive[m] for m in group_of(r, DP)[1]) + 1_000.0 for r in range(4)}
    return {r: [(tp_arrive[r], tp_depart[r], dp_arrive[r], dp_depart[r])] * STEPS for r in range(4)}


def _collective(
    rank: int,
    arrive: float,
    depart: float,
    group: str,
    ranks: tuple[int, ...],
    seq: int,
    options: dict[str, Any],
) -> list[dict[str, Any]]:
    meta: dict[str, Any] = {
        "Collective name": "allreduce",
        "dtype": "Float",
        "In msg nelems": 1024,
        "Out msg nelems": 1024,
        "Group size": len(ranks),
        "Process Group Name": group,
        "Process Group Description": "undefined",
        "Process Group Ranks": options.get("ranks_text", lambda r: str(list(r)))(ranks),
        "Rank": ranks.index(rank),
    }
    if options.get("seq", True):
        meta["Seq"] = seq
    host = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1}
    # the kernel's launch and its correlation id, unique per rank, group and sequence number
    correlation = 1_000 * int(group) + seq
    kernel_args = {k: v for k, v in meta.items() if k not in ("Seq", "Rank")}
    kernel_args |= {"correlation": correlation} if options.get("launches", True) else {}
    events = [
        {
            **host,
            "name": "c10d::allreduce_",
            "ts": arrive,
            "dur": 60.0,
            "args": {"External id": seq},
        },
        {**host, "name": "record_param_comms", "ts": arrive + 5, "dur": 50.0, "args": dict(meta)},
        {**host, "name": "nccl:all_reduce", "ts": arrive + 10, "dur": 30.0},
        {
            "ph": "X",
            "cat": "kernel",
            "pid": 0,
            "tid": 6 + int(group),  # each group's own stream
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ts": arrive + 20,
            "dur": depart - arrive - 20,
            "args": kernel_args,
        },
    ]
    if options.get("launches", True):
        launch = {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": arrive + 15, "dur": 10.0}
        events.append({**host, **launch, "args": {"correlation": correlation}})
    return events


def rank_trace(
    rank: int, *, late_rank: int = 3, late_us: float = 30_000.0, **options: Any
) -> dict[str, Any]:
    """One rank's trace document. Options: offset (µs added to its clock), seq (False: no `Seq` arg,
    as older torch), ranks_text (member ranks -> the `Process Group Ranks` text), launches (False:
    no kernel launches and no correlation ids), dp_first (the DP all-reduce before the TP one, see
    `_times`)."""
    offset = options.get("offset", {}).get(rank, 0.0)
    tp, tp_ranks = group_of(rank, TP)
    dp, dp_ranks = group_of(rank, DP)
    events: list[dict[str, Any]] = []
    for step, (tp_arrive, tp_depart, dp_arrive, dp_depart) in enumerate(
        _times(late_rank, late_us, options.get("dp_first", False))[rank]
    ):
        t0 = step * 100_000.0 + offset
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": t0,
            }
            | {"dur": 90_000.0}
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 100,
                "dur": 5e3,
            }
        )
        seq = SEQ_BASE + step
        events += _collective(rank, t0 + tp_arrive, t0 + tp_depart, tp, tp_ranks, seq, options)
        events += _collective(rank, t0 + dp_arrive, t0 + dp_depart, dp, dp_ranks, seq, options)
    events.sort(key=lambda e: (e["ts"], -e["dur"]))
    return {
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4},
        "traceEvents": events,
    }


def write_group_traces(folder: Path, **options: Any) -> list[Path]:
    """The 4 ranks' traces in `folder` (rank<N>.pt.trace.json); options as rank_trace's."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(4):
        path = folder / f"rank{rank}.pt.trace.json"
        path.write_text(json.dumps(rank_trace(rank, **options)))
        paths.append(path)
    return paths
