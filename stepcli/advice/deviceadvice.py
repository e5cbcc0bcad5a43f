"""Advice from the device figures (stepcli.traces.analyses.device, .launches): exposed
communication, a device waiting for its host, pageable copies. Same contract as
stepcli.advice.rules: each rule names its evidence and threshold and stays silent without them; the
thresholds are module constants so tests check both sides."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stepcli.advice.rules import Advice, Evidence, launch_bound
from stepcli.fmt import us

# Exposed communication: collectives with no computation beside them take at least this share of the
# step...
EXPOSED_COMM_SHARE = 0.10
# ... and when this little of the communication overlaps computation, say that it does not overlap
# at all.
NO_OVERLAP_SHARE = 0.05
# Host-bound device: the device idles waiting for its host (the next launch came after it ran dry)
# this share.
HOST_WAIT_SHARE = 0.20
# ... and at least this long per step: a toy model's device idling 1-2 ms between its few kernels is
# no finding (the same floor as the data-loading rule's).
HOST_WAIT_MIN_MS = 5.0
# Pageable copies: host-device copies from or to pageable (unpinned) memory take at least this share
# of the step.
PAGEABLE_SHARE = 0.01


def _step_ms(device: Mapping[str, Any]) -> float:
    """The mean measured step (busy + idle per step)."""
    return float(device.get("busy_ms", 0.0)) + float(device.get("idle_ms", 0.0))


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def exposed_communication(ev: Evidence) -> Advice | None:
    """Collectives run with no computation beside them: the step waits for the network."""
    device = ev.device
    if not device or not device.get("comm_share") or device.get("comm_overlap_share") is None:
        return None
    step = _step_ms(device)
    exposed = float(device["exposed_comm_ms"])
    if step <= 0 or exposed / step < EXPOSED_COMM_SHARE:
        return None
    overlap = float(device["comm_overlap_share"])
    lead = (
        "collectives do not overlap computation"
        if overlap < NO_OVERLAP_SHARE
        else f"only {_pct(overlap)} of communication overlaps computation"
    )
    return Advice(
        rule="exposed-comm",
        title="Communication is exposed",
        evidence=f"{lead}: {exposed:.2f} ms per step ({_pct(exposed / step)} of the step) runs "
        f"with no computation "
        "beside it",
        threshold=f"exposed communication ≥ {_pct(EXPOSED_COMM_SHARE)} of the step",
        suggestion="Overlap collectives with compute: tune DDP bucket_cap_mb (smaller buckets "
        "start all-reduce earlier) and gradient_as_bucket_view; with FSDP enable forward/backward "
        "prefetch; issue your own collectives with async_op=True (they run on NCCL's stream) and "
        "wait on them only when the result is needed.",
    )


def host_bound(ev: Evidence) -> Advice | None:
    """The device runs dry and waits for the host to launch the next kernel. Silent when the
    launch-bound rule (many short kernels) fires: that is the more precise diagnosis of the same
    wait."""
    device = ev.device
    if not device or not device.get("idle_by_cause") or launch_bound(ev) is not None:
        return None
    step = _step_ms(device)
    wait = float(device["idle_by_cause"]["host_wait_ms"])
    if step <= 0 or wait / step < HOST_WAIT_SHARE or wait < HOST_WAIT_MIN_MS:
        return None
    launch = device.get("launch") or {}
    extra = (
        f"; launch delay p50 {us(launch['delay_us']['p50'])}, {launch['kernels_per_step']:.0f} "
        f"kernels per step"
        if launch
        else ""
    )
    return Advice(
        rule="host-bound",
        title="The device waits for the host",
        evidence=f"the device idles {wait:.2f} ms per step ({_pct(wait / step)}) until the host "
        f"launches the next kernel{extra}",
        threshold=f"host wait ≥ {_pct(HOST_WAIT_SHARE)} of the step and ≥ {HOST_WAIT_MIN_MS:g} ms",
        suggestion="Take Python and CPU work off the step's critical path: keep metrics on the "
        "device (no .item() "
        "or .cpu() per step), prepare batches in DataLoader workers, and cut launch overhead with "
        'torch.compile(mode="reduce-overhead") or CUDA graphs.',
    )


def pageable_copies(ev: Evidence) -> Advice | None:
    """Host-device copies from pageable memory: synchronous and slower than from pinned memory."""
    device = ev.device
    if not device or ev.recorded_steps <= 0:
        return None
    rows = [k for k in ev.kernels if "Pageable" in str(k.get("name", ""))]
    step = _step_ms(device)
    if not rows or step <= 0:
        return None
    ms = sum(float(k.get("self_ms", 0.0)) for k in rows) / ev.recorded_steps
    calls = sum(int(k.get("calls", 0)) for k in rows) / ev.recorded_steps
    if ms / step < PAGEABLE_SHARE:
        return None
    return Advice(
        rule="pageable-copies",
        title="Copies use pageable host memory",
        evidence=f"{calls:.0f} copies per step from or to pageable memory take {ms:.2f} ms per "
        f"step ({_pct(ms / step)} of the step)",
        threshold=f"pageable copies ≥ {_pct(PAGEABLE_SHARE)} of the step",
        suggestion="Pin host memory: DataLoader(pin_memory=True) or tensor.pin_memory(), then "
        ".to(device, non_blocking=True) so the copy overlaps compute.",
    )


RULES: tuple[Callable[[Evidence], Advice | None], ...] = (
    exposed_communication,
    host_bound,
    pageable_copies,
)


def advise_device(evidence: Evidence) -> list[Advice]:
    """Every device rule whose evidence crosses its threshold, in a stable order."""
    return [advice for rule in RULES if (advice := rule(evidence)) is not None]
