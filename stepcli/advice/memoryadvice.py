"""Advice from a snapshot's figures, each naming its evidence and the threshold it crossed."""

from __future__ import annotations

from typing import Any

ACTIVATIONS_SHARE = 0.5  # activations at least half of the allocated memory at the moment
OPTIMIZER_SHARE = 0.4  # optimizer state at least 40%
FRAGMENTED_SHARE = 0.3  # reserved but unallocated at least 30% of reserved ...
FRAGMENTED_MIN_BYTES = 256 << 20  # ... and at least 256 MiB
# a leak holding at least half of the allocated memory at the moment comes first
LEAK_HOLDS_SHARE = 0.5


def size(count: float | None) -> str:
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{count} B"


def where(report: dict[str, Any]) -> str:
    moment = report["moment"]
    what = "at the out-of-memory error" if moment["kind"] == "oom" else "at the peak"
    step = (
        f" (step {moment['step']}, {moment['phase']})"
        if moment["step"] is not None
        else f" ({moment['phase']})"
    )
    return what + step


def advise(report: dict[str, Any]) -> list[dict[str, str]]:
    """`rule`, `text` (what to try) and `evidence` (the figures and threshold) per rule that fires;
    a leak that holds most of the memory at the moment first (nothing else helps before it is
    fixed)."""
    found: list[dict[str, str]] = []
    allocated = report["moment"]["allocated_bytes"]
    split = report["split"]
    leak = report.get("leak")
    held = (leak or {}).get("held_bytes") or 0
    holds = allocated > 0 and held / allocated >= LEAK_HOLDS_SHARE
    leak_item = _leak(report, leak, holds) if leak else None
    if leak_item is not None and holds:
        found.append(leak_item)
    if allocated > 0:
        share = split["activations"] / allocated
        if share >= ACTIVATIONS_SHARE:
            kept = (leak or {}).get("held_activation_bytes") or 0
            by_leak = f"; {size(kept)} of them kept alive by the leak" if kept else ""
            found.append(
                {
                    "rule": "activations",
                    "text": "activations dominate: use activation checkpointing "
                    "(torch.utils.checkpoint) on the largest blocks, or a smaller micro-batch "
                    "(with gradient accumulation to keep the batch size)",
                    "evidence": f"activations are {share:.0%} ({size(split['activations'])}) of "
                    f"the {size(allocated)} allocated {where(report)}{by_leak}; threshold "
                    f"{ACTIVATIONS_SHARE:.0%}",
                }
            )
        share = split["optimizer_state"] / allocated
        if share >= OPTIMIZER_SHARE:
            found.append(
                {
                    "rule": "optimizer_state",
                    "text": "optimizer state dominates: shard it (FSDP, ZeroRedundancyOptimizer, "
                    "DeepSpeed ZeRO) or use an 8-bit optimizer (bitsandbytes Adam8bit)",
                    "evidence": f"optimizer state is {share:.0%} "
                    f"({size(split['optimizer_state'])}) of the {size(allocated)} allocated "
                    f"{where(report)}; threshold {OPTIMIZER_SHARE:.0%}",
                }
            )
    fragmentation = _fragmentation(report)
    if fragmentation is not None:
        found.append(fragmentation)
    if leak_item is not None and not holds:
        found.append(leak_item)
    return found


def _leak(report: dict[str, Any], leak: dict[str, Any], holds: bool) -> dict[str, str]:
    """The leak's advice: tensors made in earlier steps kept alive
    (stepcli.snapshots.snapshotfigures.find_leak)."""
    site = leak["site"]
    named = f"{site['file']}:{site['line']} ({site['function']})" if site else "no single site"
    grows = (
        f"; the site keeps {size(leak['site_bytes_per_step'])} more per step"
        if leak["site_bytes_per_step"]
        else ""
    )
    allocated = report["moment"]["allocated_bytes"]
    held = leak.get("held_bytes")
    first = ""
    if holds:
        first = (
            f"a leak holds most of the memory ({held / allocated:.0%}): fix it first, no other "
            f"advice helps before; "
        )
    holding = (
        f"; tensors of earlier steps from that site hold {size(held)} of the {size(allocated)} "
        f"allocated {where(report)} (first when ≥ {LEAK_HOLDS_SHARE:.0%})"
        if held
        else ""
    )
    return {
        "rule": "leak",
        "text": f"{first}tensors made in earlier steps stay alive and pile up: the allocation site "
        f"is {named}; "
        "something keeps its tensors alive across steps (e.g. a loss summed without .item() or "
        ".detach(), a list of outputs)",
        "evidence": f"allocated memory at the start of steps "
        f"{leak['first_step']}-{leak['last_step']} grew {size(leak['growth_bytes'])} "
        f"(+{size(leak['per_step_bytes'])} per step{grows}), and each of those steps left tensors "
        f"alive two steps on{holding}; threshold: 3 consecutive increases, 1 MiB in all",
    }


def _fragmentation(report: dict[str, Any]) -> dict[str, str] | None:
    frag = report["fragmentation"]
    free, reserved, largest = (
        frag["free_in_reserved_bytes"],
        frag["reserved_bytes"],
        frag["largest_free_block_bytes"],
    )
    request = report.get("oom")
    fix = (
        "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of "
        "splitting)"
    )
    if frag["expandable_segments"]:
        fix = (
            "expandable_segments is already on; free or reuse large buffers earlier, or lower the "
            "peak"
        )
    if request and free >= request["requested_bytes"] > largest:
        evidence = (
            f"the failed request of {size(request['requested_bytes'])} would fit in the "
            f"{size(free)} reserved but unallocated, yet the largest free block is {size(largest)}"
        )
    elif reserved > 0 and free >= FRAGMENTED_MIN_BYTES and free / reserved >= FRAGMENTED_SHARE:
        evidence = (
            f"{size(free)} ({free / reserved:.0%}) of the {size(reserved)} reserved is not "
            f"allocated {where(report)}; threshold {FRAGMENTED_SHARE:.0%} and "
            f"{size(FRAGMENTED_MIN_BYTES)}"
        )
    else:
        return None
    return {"rule": "fragmentation", "text": f"fragmentation: {fix}", "evidence": evidence}
