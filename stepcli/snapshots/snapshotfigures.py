"""One snapshot -> the figures `stepcli memory` prints: the moment (the out-of-memory error, else
the peak), its step and phase, the split, fragmentation, the top allocation sites, every step's
figures, and a leak if any."""

from __future__ import annotations

from typing import Any

from stepcli.errors import TraceError
from stepcli.snapshots import categories
from stepcli.snapshots.allocatorreplay import AllocatorReplay, StepFigures
from stepcli.snapshots.snapshotreader import HistoryColumns, HistoryFrame, Snapshot, Stack

LEAK_MIN_INCREASES = 3  # consecutive steps whose start-of-step allocated memory grew
LEAK_MIN_BYTES = 1 << 20  # ... by at least this much in all


_MAX_DEVICE = 2**31 - 1  # a CUDA device index is a C int


def choose_device(snapshot: Snapshot) -> int:
    """The device the snapshot is about: the one that ran out of memory (as stepcli's record names
    it, else as the history shows), else the one holding the most memory. A record naming a device
    no index reaches (-1 would otherwise silently pick the last device) is TraceError."""
    info = snapshot.info or {}
    named = info.get("device")
    if isinstance(named, int) and not isinstance(named, bool):
        if not 0 <= named <= _MAX_DEVICE:
            shown = str(named) if len(str(named)) <= 20 else str(named)[:20] + "..."
            raise TraceError(
                snapshot.path,
                f"stepcli's record in it names device {shown}, which is no device index",
            )
        return named
    for device, trace in enumerate(snapshot.traces):
        if trace.has_action("oom"):
            return device
    reserved: dict[int, int] = {}
    for segment in snapshot.segments:
        reserved[segment.device] = reserved.get(segment.device, 0) + segment.total_size
    if reserved:
        return max(reserved, key=lambda d: reserved[d])
    busy = [d for d, trace in enumerate(snapshot.traces) if trace]
    return busy[0] if busy else 0


def analyze(snapshot: Snapshot, top: int = 10) -> dict[str, Any]:
    """Everything about one snapshot, as plain data (the `--json` document's per-snapshot part)."""
    device = choose_device(snapshot)
    entries = (
        snapshot.traces[device] if device < len(snapshot.traces) else HistoryColumns([], [None])
    )
    segments = [s for s in snapshot.segments if s.device == device]
    whole = AllocatorReplay(entries, segments).run()
    info = snapshot.info
    oom = whole.oom_index >= 0 or info is not None
    if whole.oom_index >= 0:
        stop: int | None = whole.oom_index
    elif oom:
        stop = None
    else:
        stop = whole.peak_index + 1
    at = AllocatorReplay(entries, segments, stop=stop).run()
    moment_entry = (
        entries[whole.oom_index]
        if whole.oom_index >= 0
        else (entries[whole.peak_index] if not oom and whole.peak_index >= 0 else None)
    )
    moment = _moment(snapshot, at, moment_entry, oom)
    largest_free = max(
        (b.size for s in segments for b in s.blocks if b.state == "inactive"), default=0
    )
    request = _request(info, moment_entry if oom else None)
    return {
        "file": snapshot.path,
        "device": device,
        "written_by": "stepcli run --memory" if info is not None else "torch.cuda.memory._snapshot",
        "history_entries": len(entries),
        "moment": moment,
        "oom": request,
        "split": _split(snapshot.stacks, at),
        "fragmentation": {
            "reserved_bytes": at.reserved,
            "allocated_bytes": at.allocated,
            "free_in_reserved_bytes": max(at.reserved - at.allocated, 0),
            "largest_free_block_bytes": largest_free,
            "request_fits_largest_block": (largest_free >= request["requested_bytes"])
            if request
            else None,
            "expandable_segments": bool(snapshot.allocator_settings.get("expandable_segments"))
            or any(s.expandable for s in segments),
        },
        "top_sites": _sites(snapshot.stacks, at, top),
        "steps": [_step_json(f) for f in sorted(whole.steps.values(), key=lambda f: f.step)],
        "leak": find_leak(whole.steps, whole.survivors, snapshot.stacks, at, moment["step"]),
    }


def _moment(snapshot: Snapshot, at: AllocatorReplay, entry: Any, oom: bool) -> dict[str, Any]:
    info = snapshot.info or {}
    step = info.get("step") if "step" in info else (entry.step if entry is not None else None)
    if isinstance(info.get("phase"), str):
        phase = info["phase"]
    elif entry is not None:
        stack = snapshot.stacks[entry.stack]
        phase = categories.phase(stack) if stack or entry.step is None else "backward"
    else:
        phase = "unknown"
    return {
        "kind": "oom" if oom else "peak",
        "step": step if isinstance(step, int) else None,
        "phase": phase,
        "allocated_bytes": at.allocated,
        "reserved_bytes": at.reserved,
    }


def _request(info: dict[str, Any] | None, entry: Any) -> dict[str, Any] | None:
    """What the failed allocation asked for: from the agent's record, else from the history's `oom`
    event."""
    if info is not None and _byte_count(info.get("requested_bytes")) is not None:
        return {
            "requested_bytes": info["requested_bytes"],
            "device_free_bytes": _byte_count(info.get("device_free_bytes")),
            "device_total_bytes": _byte_count(info.get("device_total_bytes")),
        }
    if entry is not None:
        return {
            "requested_bytes": entry.size,
            "device_free_bytes": entry.addr,
            "device_total_bytes": None,
        }
    return None


def _byte_count(value: Any) -> int | None:
    """A count of bytes from the agent's record, or None for anything else (a snapshot is untrusted
    input: a string, a float, NaN or a negative number there is no figure to show)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63:
        return value
    return None


def _split(stacks: list[Stack], at: AllocatorReplay) -> dict[str, int]:
    split = dict.fromkeys(categories.CATEGORIES, 0)
    cache: dict[tuple[int, bool], str] = {}
    for size, stack, step in at.live.values():
        key = (stack, step is not None)
        name = cache.get(key)
        if name is None:
            name = cache[key] = categories.category(stacks[stack], step is not None)
        split[name] += size
    return split


def _frame_json(frame: HistoryFrame | None) -> dict[str, Any] | None:
    if frame is None:
        return None
    return {"file": frame.filename, "line": frame.line, "function": frame.name}


def _site_key(stacks: list[Stack], stack: int) -> tuple[HistoryFrame | None, HistoryFrame | None]:
    return categories.site(stacks[stack])


def _sites(stacks: list[Stack], at: AllocatorReplay, top: int) -> list[dict[str, Any]]:
    sites: dict[HistoryFrame | None, dict[str, Any]] = {}
    for size, stack, step in at.live.values():
        frame, via = _site_key(stacks, stack)
        row = sites.get(frame)
        if row is None:
            row = sites[frame] = {
                "site": _frame_json(frame),
                "via": _frame_json(via),
                "bytes": 0,
                "blocks": 0,
            }
            row["_categories"] = {}
        row["bytes"] += size
        row["blocks"] += 1
        name = categories.category(stacks[stack], step is not None)
        row["_categories"][name] = row["_categories"].get(name, 0) + size
    total = max(at.allocated, 1)
    rows = sorted(sites.values(), key=lambda r: -r["bytes"])[:top]
    for row in rows:
        found = row.pop("_categories")
        row["category"] = max(found, key=lambda n: found[n])
        row["share"] = round(row["bytes"] / total, 4)
    return rows


def _step_json(figures: StepFigures) -> dict[str, Any]:
    return {
        "step": figures.step,
        "start_allocated_bytes": figures.start_allocated,
        "peak_allocated_bytes": figures.peak_allocated,
        "start_reserved_bytes": figures.start_reserved,
        "peak_reserved_bytes": figures.peak_reserved,
        "complete": figures.complete,
    }


def find_leak(
    steps: dict[int, StepFigures],
    survivors: dict[int, dict[int, int]],
    stacks: list[Stack],
    at: AllocatorReplay | None = None,
    moment_step: int | None = None,
) -> dict[str, Any] | None:
    """Tensors made in earlier steps, still alive and piling up: allocated memory at the start of a
    step (the same phase every step) that grew over the last LEAK_MIN_INCREASES+ consecutive steps
    by LEAK_MIN_BYTES+ in all, while every one of those steps (whose fate is known) left allocations
    alive two steps on, LEAK_MIN_BYTES+ in all. A start-of-step figure that only grows with the
    batch (each step's tensors freed in the next one) is no leak. With it, the site whose
    allocations outlive their step by the most bytes in every one of those steps, and (`at`: the
    moment's replay) the bytes that site's allocations of earlier steps than the moment's
    (`moment_step`) hold then, `held_bytes`."""
    series = [f for f in sorted(steps.values(), key=lambda f: f.step) if f.complete]
    if not series:
        return None
    run = [series[-1]]
    for figures in reversed(series[:-1]):
        if figures.start_allocated < run[0].start_allocated and figures.step == run[0].step - 1:
            run.insert(0, figures)
        else:
            break
    growth = run[-1].start_allocated - run[0].start_allocated
    if len(run) <= LEAK_MIN_INCREASES or growth < LEAK_MIN_BYTES:
        return None
    checked = [f.step for f in run[:-1] if f.step in survivors]
    kept = [sum(survivors[step].values()) for step in checked]
    if not checked or min(kept) <= 0 or sum(kept) < LEAK_MIN_BYTES:
        # nothing made in those steps stays alive: memory grew with the work, not with kept tensors
        return None
    per_site: dict[HistoryFrame | None, dict[int, int]] = {}
    for step in checked:
        for stack, size in survivors[step].items():
            frame, _via = categories.site(stacks[stack])
            bucket = per_site.setdefault(frame, {})
            bucket[step] = bucket.get(step, 0) + size
    steady = {frame: sizes for frame, sizes in per_site.items() if len(sizes) == len(checked)}
    grows = max(steady, key=lambda f: sum(steady[f].values()), default=None) if steady else None
    held, held_activations = (
        _held(stacks, at, grows, moment_step) if grows is not None else (None, None)
    )
    return {
        "first_step": run[0].step,
        "last_step": run[-1].step,
        "start_allocated_bytes": [f.start_allocated for f in run],
        "growth_bytes": growth,
        "per_step_bytes": growth // (len(run) - 1),
        "site": _frame_json(grows),
        "site_bytes_per_step": (sum(steady[grows].values()) // len(checked))
        if grows in steady
        else None,
        "held_bytes": held,
        "held_activation_bytes": held_activations,
    }


def _held(
    stacks: list[Stack], at: AllocatorReplay | None, site: HistoryFrame, moment_step: int | None
) -> tuple[int | None, int | None]:
    """(bytes, of which activations) alive at the moment that the leak's site allocated in steps
    before the moment's (tensors of the moment's own step are not kept yet); (None, None) without a
    moment or its step."""
    if at is None or moment_step is None:
        return None, None
    held = activations = 0
    for size, stack, step in at.live.values():
        if step is not None and step < moment_step and categories.site(stacks[stack])[0] == site:
            held += size
            if categories.category(stacks[stack], True) == "activations":
                activations += size
    return held, activations
