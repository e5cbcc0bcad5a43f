"""The last `torch.distributed` collective this process entered, for hang dumps (`stepcli run
--hang-timeout`).

Runs inside the target: standard library only. torch.distributed's Python collectives (all_reduce,
barrier, ...) are wrapped once, when torch.distributed is imported, only in runs with
`--hang-timeout`: each call numbers itself (the n-th collective this process entered; every rank of
a data-parallel job enters the same ones in the same order, so equal numbers are the same
collective) and notes when it entered and whether it returned. That is a few attribute stores per
collective, nothing per step. Collectives issued from C++ (DDP's bucketed all-reduce, FSDP) and
those inside torch.compile'd code (compiled from the original function) are not seen by the
wrappers: for them the dump asks torch's flight recorder (`in_flight`), which `stepcli run
--hang-timeout` turns on for the program (TORCH_FR_BUFFER_SIZE, gloo and NCCL): the work every
process group of this process started and has not finished.
"""

from __future__ import annotations

import time

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

# The collectives and point-to-point calls of torch.distributed's Python API that can block on other
# ranks.
HOOKED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
)


class LastCollective:
    """What the dump reports: the last collective entered (name, number, wall time), and whether it
    returned."""

    __slots__ = ("name", "seq", "entered_at", "returned_at", "depth", "async_op", "group")

    def __init__(self) -> None:
        self.name = ""
        self.seq = 0
        self.entered_at = 0.0
        self.returned_at = 0.0
        # > 0 while inside a hooked call: collectives it makes itself are not counted again
        self.depth = 0
        self.async_op = False
        # the `group=` it was given (None: the default group), named only when dumped
        self.group: Any = None

    def to_dict(self, now: float) -> dict[str, Any] | None:
        if not self.seq:
            return None
        returned = self.returned_at >= self.entered_at and self.depth == 0
        return {
            "name": self.name,
            "seq": self.seq,
            "entered_s_ago": round(now - self.entered_at, 3),
            "returned": returned,
            "returned_s_ago": round(now - self.returned_at, 3) if returned else None,
            "async_op": self.async_op,
            "group": _group_name(self.group),
        }


def _group_name(group: Any) -> str:
    if group is None:
        return "default"
    try:
        return str(group.group_name)
    except Exception:
        return repr(group)[:100]


LAST = LastCollective()


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    last = LAST

    def stepcli_collective(*args: Any, **kwargs: Any) -> Any:
        if last.depth:
            return original(*args, **kwargs)
        last.seq += 1
        last.name = name
        last.async_op = bool(kwargs.get("async_op"))
        last.group = kwargs.get("group")
        last.entered_at = time.time()
        last.depth = 1
        try:
            return original(*args, **kwargs)
        finally:
            last.depth = 0
            last.returned_at = time.time()

    stepcli_collective.__name__ = getattr(original, "__name__", name)
    stepcli_collective.__qualname__ = getattr(original, "__qualname__", name)
    stepcli_collective.__doc__ = getattr(original, "__doc__", None)
    # torch.compile unwraps it and traces the original (as a functional collective): one graph, not
    # a graph break
    stepcli_collective.__wrapped__ = original  # type: ignore[attr-defined]
    stepcli_collective._stepcli = True  # type: ignore[attr-defined]
    return stepcli_collective


def _wrap_join(original: Callable[..., Any], on_join: Callable[[], None]) -> Callable[..., Any]:
    """`init_process_group` that first tells the agent this process joins a job (before it may block
    there)."""

    def stepcli_init_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            on_join()
        except Exception:  # (the agent never raises; the program's call must happen whatever)
            pass
        return original(*args, **kwargs)

    stepcli_init_process_group.__name__ = getattr(original, "__name__", "init_process_group")
    stepcli_init_process_group.__qualname__ = getattr(
        original, "__qualname__", "init_process_group"
    )
    stepcli_init_process_group.__doc__ = getattr(original, "__doc__", None)
    stepcli_init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    stepcli_init_process_group._stepcli = True  # type: ignore[attr-defined]
    return stepcli_init_process_group


def hook_collectives(dist: ModuleType, on_join: Callable[[], None] | None = None) -> None:
    """Wrap the collectives of `torch.distributed` and of `torch.distributed.distributed_c10d` (same
    objects), and `init_process_group` to call `on_join` (a rank stuck before its first step is then
    in a hang's dump)."""
    import sys

    # (device_mesh, imported with torch.distributed, holds its own reference to init_process_group)
    modules = [
        dist,
        *(sys.modules.get(f"torch.distributed.{m}") for m in ("distributed_c10d", "device_mesh")),
    ]
    names = (*HOOKED, "init_process_group") if on_join is not None else HOOKED
    wrapped: dict[int, Callable[..., Any]] = {}
    for module in modules:
        if module is None:
            continue
        for name in names:
            original = getattr(module, name, None)
            if original is None or getattr(original, "_stepcli", False):
                continue
            if id(original) not in wrapped:
                if name == "init_process_group" and on_join is not None:
                    wrapped[id(original)] = _wrap_join(original, on_join)
                else:
                    wrapped[id(original)] = _wrap(name, original)
            setattr(module, name, wrapped[id(original)])


# in-flight works listed per dump (a hang has one or a few; DDP buckets may add some)
FR_MAX_ENTRIES = 8
_FR_MAX_BYTES = 16 << 20


def in_flight(now: float) -> list[dict[str, Any]] | None:
    """The collectives this process's process groups started and have not finished, oldest first,
    from torch's flight recorder (`_dump_fr_trace_json`): name, the group's sequence number (equal
    on every rank for the same collective), group, sizes, how long ago it was started. None when
    that cannot be known: torch.distributed not initialized here, a torch without the recorder, or
    the recorder off (no TORCH_FR_BUFFER_SIZE)."""
    import json
    import os
    import sys

    dist = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch._C._distributed_c10d")
    try:
        if dist is None or c10d is None or not dist.is_available() or not dist.is_initialized():
            return None
        if not any(
            int(os.environ.get(name) or 0) > 0
            for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
        ):
            return None  # off: an empty recorder would read as "nothing in flight"
        dump = getattr(c10d, "_dump_fr_trace_json", None)
        if dump is None:
            return None
        data = dump(True, True)
        if len(data) > _FR_MAX_BYTES:
            return None
        document = json.loads(data)
    except Exception:
        return None
    entries = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        return [] if isinstance(document, dict) else None
    found = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("retired") is not False:
            continue
        name = str(entry.get("profiling_name") or "?").rsplit(":", 1)[-1]
        p2p = bool(entry.get("is_p2p"))
        group = entry.get("process_group")
        created = entry.get("time_created_ns")
        found.append(
            {
                "name": name,
                "seq": entry.get("p2p_seq_id" if p2p else "collective_seq_id"),
                "group": str(group[1])
                if isinstance(group, list) and len(group) > 1
                else str(entry.get("pg_id")),
                "p2p": p2p,
                "sizes": entry.get("input_sizes"),
                "dtypes": entry.get("input_dtypes"),
                "state": entry.get("state"),
                "entered_s_ago": round(now - created / 1e9, 3)
                if isinstance(created, int) and created > 0
                else None,
            }
        )
    return found[:FR_MAX_ENTRIES]
