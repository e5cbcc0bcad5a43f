"""Write a synthetic distributed job's traces: one Kineto trace per rank, with the structure of a
real NCCL job.

Usage: python scripts/make_job.py --ranks N [--steps S] [--collectives C] [--out DIR] [--late-rank
R]
       [--late-ms MS] [--shifted-rank K] [--shift-s SECONDS] [--tp T] [--gz]

Each rank's trace (`rank<R>.pt.trace.json`, rank and world size in distributedInfo) holds S
`ProfilerStep#N` windows on its main thread; each step is C rounds of compute then a collective.
Compute: `aten::linear` > `aten::mm` > `cudaLaunchKernel`, and its GEMM kernel on stream 7 (same
correlation id). A collective, as torch >= 2.2 records it: `c10d::allreduce_` > `record_param_comms`
(process group name, its ranks, the group's sequence number, the NCCL metadata) > `nccl:all_reduce`
> `cudaLaunchKernel`, and the NCCL kernel on its group's own stream (20 for tensor-parallel groups,
21 for data-parallel ones), running from the launch until the group's last member has arrived, plus
the transfer time. Rounds alternate between the rank's tensor-parallel group (T consecutive ranks)
and its data-parallel group (the ranks with the same position in theirs).

Planted: the late rank (--late-rank, default N // 3) computes --late-ms a step longer (spread over
its rounds, as a slower GPU or host would), so the members of its groups wait for it at every round;
the shifted rank's clock (--shifted-rank, default the last rank) is --shift-s seconds ahead, as on
another host, so ranks can only be compared once clocks are aligned by the collectives. Times are
deterministic (a few microseconds of per-rank jitter, no ties). Small files on purpose (~70 KB a
rank at the defaults), so 1,024 ranks fit in ~100 MB. Prints what was planted as one JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

SEQ_BASE = 100  # the window starts mid-run: sequence numbers do not start at 0
STEP_BASE = 20  # and neither do step numbers
COMPUTE_US = 1_500.0  # one round's compute
TRANSFER_US = 300.0  # a collective's time once its last member has arrived
_GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel"  # noqa: E501
_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def tp_size(ranks: int, tp: int | None) -> int:
    """The tensor-parallel group size: --tp, else 8 (a node), at most half the job (so DP groups
    have 2+)."""
    size = tp or max(1, min(8, ranks // 2))
    if ranks % size:
        raise SystemExit(f"--ranks {ranks} is not a multiple of the tensor-parallel size {size}")
    return size


def timeline(
    ranks: int, steps: int, collectives: int, tp: int, late_rank: int, late_us: float
) -> dict[str, Any]:
    """Per rank, step and round: arrival and departure (µs, on a common clock), and each step's
    start and end.

    A collective departs TRANSFER_US after its group's last member arrives; a rank arrives
    COMPUTE_US (+ a few µs of its own jitter, + late_us / collectives for the late rank) after it
    departed the previous one."""
    jitter = (np.arange(ranks) * 7919 % 997) / 100.0  # 0-10 µs, distinct per rank (no exact ties)
    grid = (ranks // tp, tp)
    arrive = np.zeros((steps, collectives, ranks))
    depart = np.zeros((steps, collectives, ranks))
    step_start = np.zeros((steps, ranks))
    step_end = np.zeros((steps, ranks))
    t = np.full(ranks, 1_000.0)
    for s in range(steps):
        step_start[s] = t
        t = t + 100.0
        for c in range(collectives):
            a = t + COMPUTE_US + jitter
            a[late_rank] += late_us / collectives
            shaped = a.reshape(grid)
            last = (
                shaped.max(axis=1, keepdims=True)
                if c % 2 == 0
                else shaped.max(axis=0, keepdims=True)
            )
            d = np.broadcast_to(last + TRANSFER_US, grid).reshape(ranks)
            arrive[s, c], depart[s, c] = a, d
            t = d + 20.0
        t = t + 400.0  # optimizer
        step_end[s] = t
        t = t + 50.0
    return {"arrive": arrive, "depart": depart, "start": step_start, "end": step_end}


def groups_of(rank: int, ranks: int, tp: int) -> list[tuple[str, list[int]]]:
    """(name, members) of the rank's TP group and DP group, as torch names them (numbers as
    strings)."""
    node = rank // tp
    tp_name, tp_members = str(1 + node), list(range(node * tp, node * tp + tp))
    dp_name, dp_members = str(1 + ranks // tp + rank % tp), list(range(rank % tp, ranks, tp))
    return [(tp_name, tp_members), (dp_name, dp_members)]


def rank_trace(
    rank: int,
    ranks: int,
    steps: int,
    collectives: int,
    tp: int,
    times: dict[str, Any],
    shift_us: float,
) -> dict[str, Any]:
    """One rank's trace document."""
    pid, main, stream_of = 1_000 + rank, 1_000 + rank, {0: 20, 1: 21}
    host = {"ph": "X", "cat": "cpu_op", "pid": pid, "tid": main}
    groups = groups_of(rank, ranks, tp)
    events: list[dict[str, Any]] = []
    external = correlation = 1
    seq = {name: SEQ_BASE for name, _ in groups}

    def at(value: float) -> float:
        return round(float(value) + shift_us, 3)

    for s in range(steps):
        start, end = times["start"][s, rank], times["end"][s, rank]
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{STEP_BASE + s}",
                "pid": pid,
                "tid": main,
            }
            | {"ts": at(start), "dur": round(end - start, 3), "args": {"External id": external}}
        )
        external += 1
        ready = start + 100.0
        for c in range(collectives):
            arrive, depart = times["arrive"][s, c, rank], times["depart"][s, c, rank]
            # compute: linear > mm > launch, and its kernel
            busy = arrive - ready - 30.0
            events.append({**host, "name": "aten::linear", "ts": at(ready), "dur": round(busy, 3)})
            events[-1]["args"] = {
                "External id": external,
                "Input type": ["float", "float", "float"],
            }
            events.append(
                {**host, "name": "aten::mm", "ts": at(ready + 5), "dur": round(busy - 10, 3)}
            )
            events[-1]["args"] = {"External id": external + 1, "Input type": ["float", "float"]}
            launch = ready + 10
            events.append(
                {
                    **host,
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "ts": at(launch),
                    "dur": 8.0,
                }
            )
            events[-1]["args"] = {
                "External id": external + 1,
                "correlation": correlation,
                "cbid": 211,
            }
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": _GEMM,
                    "pid": 0,
                    "tid": 7,
                    "ts": at(launch + 20),
                }
                | {
                    "dur": round(busy - 60, 3),
                    "args": {"External id": external + 1, "correlation": correlation},
                }
                | {"device": 0, "stream": 7}
            )
            external += 2
            correlation += 1
            # the collective
            name, members = groups[c % 2]
            meta: dict[str, Any] = {
                "Collective name": "allreduce",
                "dtype": "Float",
                "In msg nelems": 1 << 20,
                "Out msg nelems": 1 << 20,
                "Group size": len(members),
                "Process Group Name": name,
                "Process Group Description": "undefined",
                "Process Group Ranks": str(members),
            }
            events.append({**host, "name": "c10d::allreduce_", "ts": at(arrive), "dur": 60.0})
            events[-1]["args"] = {"External id": external}
            events.append({**host, "name": "record_param_comms", "ts": at(arrive + 5), "dur": 50.0})
            events[-1]["args"] = meta | {
                "Seq": seq[name],
                "Rank": members.index(rank),
                "External id": external + 1,
            }
            events.append({**host, "name": "nccl:all_reduce", "ts": at(arrive + 10), "dur": 30.0})
            events.append(
                {**host, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": at(arrive + 15)}
            )
            events[-1] |= {
                "dur": 10.0,
                "args": {"External id": external + 1, "correlation": correlation},
            }
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": _NCCL,
                    "pid": 0,
                    "tid": stream_of[c % 2],
                    "ts": at(arrive + 20),
                }
                | {
                    "dur": round(depart - arrive - 20, 3),
                    "args": meta | {"correlation": correlation},
                }
                | {"device": 0, "stream": stream_of[c % 2]}
            )
            # the host waits for the collective's end (as DDP's reducer or a .wait() does): without
            # the call, its gap would read as its own time
            events.append(
                {
                    **host,
                    "cat": "cuda_runtime",
                    "name": "cudaStreamSynchronize",
                    "ts": at(arrive + 62),
                    "dur": round(depart - arrive - 52, 3),
                }
            )
            seq[name] += 1
            external += 2
            correlation += 1
            ready = depart + 20.0
        events.append(
            {**host, "name": "Optimizer.step#AdamW.step", "ts": at(ready + 20), "dur": 360.0}
        )
    events.sort(key=lambda e: (e["ts"], -e["dur"]))
    meta_events = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank{rank}"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": main, "args": {"name": "python"}},
    ]
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
        "traceEvents": meta_events + events,
    }


def write_job(
    out: Path,
    ranks: int,
    steps: int = 4,
    collectives: int = 8,
    *,
    late_rank: int | None = None,
    late_ms: float = 5.0,
    shifted_rank: int | None = None,
    shift_s: float = 3.5,
    tp: int | None = None,
    gz: bool = False,
) -> dict[str, Any]:
    """Write the job's traces into `out`; return what was planted (late rank, shifted rank, groups'
    sizes)."""
    if ranks < 2 or steps < 1 or collectives < 1:
        raise SystemExit("a job needs 2+ ranks, 1+ steps and 1+ collectives")
    size = tp_size(ranks, tp)
    late = ranks // 3 if late_rank is None else late_rank
    shifted = ranks - 1 if shifted_rank is None else shifted_rank
    if late == shifted:
        raise SystemExit("the late rank and the shifted rank must differ")
    times = timeline(ranks, steps, collectives, size, late, late_ms * 1000.0)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for rank in range(ranks):
        doc = rank_trace(
            rank, ranks, steps, collectives, size, times, shift_s * 1e6 if rank == shifted else 0.0
        )
        text = json.dumps(doc, separators=(",", ":")).encode()
        path = out / f"rank{rank}.pt.trace.json{'.gz' if gz else ''}"
        path.write_bytes(gzip.compress(text, 1) if gz else text)
        total += path.stat().st_size
    return {
        "ranks": ranks,
        "steps": steps,
        "collectives_per_step": collectives,
        "tp": size,
        "late_rank": late,
        "late_ms": late_ms,
        "shifted_rank": shifted,
        "shift_s": shift_s,
        "bytes": total,
    }


def main(argv: list[str] | None = None) -> int:
    assert __doc__
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--collectives", type=int, default=8, help="collectives per step")
    parser.add_argument("--out", type=Path, default=None, help="folder to write (default: job-<N>)")
    parser.add_argument("--late-rank", type=int, default=None)
    parser.add_argument("--late-ms", type=float, default=5.0)
    parser.add_argument("--shifted-rank", type=int, default=None)
    parser.add_argument("--shift-s", type=float, default=3.5)
    parser.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel group size (default min(8, N/2))"
    )
    parser.add_argument("--gz", action="store_true", help="write .pt.trace.json.gz")
    args = parser.parse_args(argv)
    planted = write_job(
        args.out or Path(f"job-{args.ranks}"),
        args.ranks,
        args.steps,
        args.collectives,
        late_rank=args.late_rank,
        late_ms=args.late_ms,
        shifted_rank=args.shifted_rank,
        shift_s=args.shift_s,
        tp=args.tp,
        gz=args.gz,
    )
    print(json.dumps(planted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
