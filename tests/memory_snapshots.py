"""Build CUDA memory snapshots in torch's format (`torch.cuda.memory._snapshot()`), small, for the
tests.

`SnapshotBuilder` plays a tiny caching allocator: segments from `cudaMalloc` split into blocks
(first fit, 512-byte rounding, neighbours merged on free), and the history torch records for it:
`segment_alloc`, `alloc`, `free_requested`, `free_completed`, `oom`, each with `addr`/`device_free`,
`size`, `stream`, `time_us`, `compile_context`, `user_metadata` and innermost-first `frames`
({filename, line, name}). torch's own readers (`torch.cuda._memory_viz.segsum` and `trace`) read
what it writes; tests/unit/test_snapshots_fixtures.py checks.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

TORCH = "/usr/lib/python3/site-packages/torch"
SCRIPT = "/work/train.py"
MiB = 1 << 20
# a new segment: at least 20 MiB (torch's large pool), else the request rounded up to 2 MiB
SEGMENT = 20 * MiB

Frames = list[dict[str, Any]]


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def user(line: int, name: str = "main") -> dict[str, Any]:
    return frame(SCRIPT, line, name)


def to_device(line: int) -> Frames:
    """model.to('cuda'): parameters."""
    return [
        frame(f"{TORCH}/nn/modules/module.py", 1350, "convert"),
        frame(f"{TORCH}/nn/modules/module.py", 942, "_apply"),
        frame(f"{TORCH}/nn/modules/module.py", 1371, "to"),
        user(line),
    ]


def forward(line: int, layer: str = "linear.py", layer_line: int = 125) -> Frames:
    """An activation made inside a module's forward, called from the script's line."""
    return [
        frame(f"{TORCH}/nn/modules/{layer}", layer_line, "forward"),
        frame(f"{TORCH}/nn/modules/module.py", 1786, "_call_impl"),
        frame(f"{TORCH}/nn/modules/module.py", 1775, "_wrapped_call_impl"),
        user(line),
    ]


def optimizer_state(line: int) -> Frames:
    """Adam's exp_avg / exp_avg_sq, created lazily in its first step()."""
    return [
        frame(f"{TORCH}/optim/adam.py", 168, "_init_group"),
        frame(f"{TORCH}/optim/adam.py", 247, "step"),
        frame(f"{TORCH}/optim/optimizer.py", 516, "wrapper"),
        user(line),
    ]


class SnapshotBuilder:
    def __init__(self, base: int = 0x7F0000000000, device: int = 0) -> None:
        self.device = device
        self.next_segment = base
        self.segments: list[dict[str, Any]] = []
        self.trace: list[dict[str, Any]] = []
        self.metadata = ""
        self.time_us = 1_700_000_000_000_000
        self.requested: dict[int, int] = {}
        self.frames: dict[int, Frames] = {}

    # -- the history
    # --------------------------------------------------------------------------------------------
    def _entry(
        self, action: str, addr_key: str, addr: int, size: int, frames: Frames | None
    ) -> None:
        self.time_us += 7
        entry: dict[str, Any] = {
            "action": action,
            addr_key: addr,
            "size": size,
            "stream": 0,
            "time_us": self.time_us,
            "compile_context": "",
            "user_metadata": self.metadata,
        }
        if frames is not None:
            entry["frames"] = frames
        self.trace.append(entry)

    def step(self, number: int) -> None:
        """What `stepcli run --memory` does at each step boundary: tag the allocations that
        follow."""
        self.metadata = f"stepcli:step={number}"

    def _new_segment(self, size: int, frames: Frames) -> dict[str, Any]:
        total = max(SEGMENT, -(-size // (2 * MiB)) * 2 * MiB)
        address = self.next_segment
        self.next_segment += total + 64 * MiB
        segment = {
            "device": self.device,
            "address": address,
            "total_size": total,
            "allocated_size": 0,
            "active_size": 0,
            "requested_size": 0,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": frames,
            "blocks": [
                {
                    "address": address,
                    "size": total,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            ],
        }
        self.segments.append(segment)
        self._entry("segment_alloc", "addr", address, total, frames)
        return segment

    def alloc(self, size: int, frames: Frames) -> int:
        """Allocate `size` bytes (rounded up to 512) in the first free block that fits, else a new
        segment."""
        rounded = -(-size // 512) * 512
        for segment in self.segments:
            for index, block in enumerate(segment["blocks"]):
                if block["state"] == "inactive" and block["size"] >= rounded:
                    return self._take(segment, index, rounded, size, frames)
        segment = self._new_segment(rounded, frames)
        return self._take(segment, 0, rounded, size, frames)

    def _take(
        self, segment: dict[str, Any], index: int, rounded: int, size: int, frames: Frames
    ) -> int:
        block = segment["blocks"][index]
        if block["size"] > rounded:
            rest = {
                "address": block["address"] + rounded,
                "size": block["size"] - rounded,
                "requested_size": 0,
                "state": "inactive",
                "frames": [],
            }
            segment["blocks"].insert(index + 1, rest)
        block.update(size=rounded, requested_size=size, state="active_allocated", frames=frames)
        self._entry("alloc", "addr", block["address"], rounded, frames)
        return int(block["address"])

    def free(self, addr: int) -> None:
        for segment in self.segments:
            blocks = segment["blocks"]
            for index, block in enumerate(blocks):
                if block["address"] == addr and block["state"] == "active_allocated":
                    self._entry("free_requested", "addr", addr, block["size"], None)
                    self._entry("free_completed", "addr", addr, block["size"], None)
                    block.update(state="inactive", requested_size=0, frames=[])
                    self._merge(blocks, index)
                    return
        raise KeyError(hex(addr))

    @staticmethod
    def _merge(blocks: list[dict[str, Any]], index: int) -> None:
        if index + 1 < len(blocks) and blocks[index + 1]["state"] == "inactive":
            blocks[index]["size"] += blocks.pop(index + 1)["size"]
        if index > 0 and blocks[index - 1]["state"] == "inactive":
            blocks[index - 1]["size"] += blocks.pop(index)["size"]

    def oom(self, size: int, device_free: int, frames: Frames) -> None:
        self._entry("oom", "device_free", device_free, size, frames)

    # -- the snapshot
    # -------------------------------------------------------------------------------------------
    def snapshot(self, info: dict[str, Any] | None = None, history: bool = True) -> dict[str, Any]:
        for segment in self.segments:
            active = [b for b in segment["blocks"] if b["state"] == "active_allocated"]
            segment["allocated_size"] = segment["active_size"] = sum(b["size"] for b in active)
            segment["requested_size"] = sum(b["requested_size"] for b in active)
        data: dict[str, Any] = {
            "segments": self.segments,
            "device_traces": [self.trace if history else []],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
            "external_annotations": [],
        }
        if info is not None:
            data["stepcli"] = {"version": 1, "device": self.device, **info}
        return data

    def write(self, path: Path, info: dict[str, Any] | None = None) -> Path:
        with open(path, "wb") as handle:
            pickle.dump(self.snapshot(info), handle)
        return path


# -- scenarios
# ------------------------------------------------------------------------------------------------
def training(
    steps: int = 5,
    params: int = 40 * MiB,
    activation: int = 30 * MiB,
    layers: int = 4,
    adam: bool = True,
    leak: int = 0,
) -> SnapshotBuilder:
    """A training loop: parameters moved to the device, then per step: forward activations, backward
    gradients (allocated by autograd's device thread: no Python frames), Adam's state at the first
    step, temporaries. `leak` bytes per step are kept alive at train.py:31 (a loss history that
    holds tensors)."""
    b = SnapshotBuilder()
    b.step(0)
    for _ in range(layers):
        b.alloc(params // layers, to_device(12))
    grads: list[int] = []
    for step in range(steps):
        b.step(step)
        acts = [b.alloc(activation // layers, forward(20 + i)) for i in range(layers)]
        if leak:
            b.alloc(leak, [user(31)])
        for a in reversed(acts):  # backward frees activations, makes gradients
            b.free(a)
        # zero_grad(set_to_none=True) in the next iteration freed them; here before backward
        for g in grads:
            b.free(g)
        grads = [b.alloc(params // layers, []) for _ in range(layers)]
        if adam and step == 0:
            for _ in range(2 * layers):
                b.alloc(params // layers, optimizer_state(27))
    return b


def oom_in_forward(steps: int = 4) -> tuple[SnapshotBuilder, dict[str, Any]]:
    """Activations fill the device; the next forward's request fails."""
    b = training(steps=steps, params=8 * MiB, activation=60 * MiB, adam=True)
    b.step(steps)
    for i in range(6):
        b.alloc(40 * MiB, forward(20 + i % 4))
    request = 512 * MiB
    b.oom(request, 3 * MiB, forward(22))
    info = {
        "step": steps,
        "phase": "forward",
        "requested_bytes": request,
        "device_total_bytes": 8 << 30,
    }
    info["device_free_bytes"] = 3 * MiB
    return b, info


def fragmented() -> tuple[SnapshotBuilder, dict[str, Any]]:
    """Half of 32 segments of 20 MiB is free, in holes of 10 MiB between live blocks: 320 MiB free
    in all, yet a 32 MiB request fits in none."""
    b = SnapshotBuilder()
    b.step(1)
    kept = []
    for _ in range(32):
        kept.append(b.alloc(10 * MiB, forward(40)))
        b.alloc(10 * MiB, [user(41)])
    for addr in kept:
        b.free(addr)
    b.oom(32 * MiB, 1 * MiB, [user(44)])
    info = {"step": 1, "phase": "forward", "requested_bytes": 32 * MiB, "device_free_bytes": MiB}
    return b, info


def batch_doubling(
    steps: int = 5, params: int = 8 * MiB, batch: int = 4 * MiB, layers: int = 4
) -> tuple[SnapshotBuilder, dict[str, Any]]:
    """A batch that doubles every step until forward runs out of memory. Each step's input batch
    (train.py:16) and output (train.py:24) stay alive into the next step, until the names are bound
    again, so memory at each step's start grows with the batch; yet nothing a step makes outlives
    the step after it: no leak."""
    b = SnapshotBuilder()
    b.step(0)
    for _ in range(layers):
        b.alloc(params // layers, to_device(12))
    grads: list[int] = []
    kept: list[int] = []  # the previous step's batch and output
    for step in range(steps + 1):
        b.step(step)
        size = batch << step
        x = b.alloc(size, [user(16)])
        for addr in kept:  # `x = ...` and `out = model(x)` drop the previous step's
            b.free(addr)
        acts = [b.alloc(2 * size, forward(20 + i)) for i in range(layers)]
        if step == steps:
            request = 4 * size
            b.oom(request, MiB, forward(20))
            info = {
                "step": steps,
                "phase": "forward",
                "requested_bytes": request,
                "device_total_bytes": 8 << 30,
            }
            info["device_free_bytes"] = MiB
            return b, info
        out = b.alloc(size // 4, forward(24))
        for a in reversed(acts):
            b.free(a)
        for g in grads:
            b.free(g)
        grads = [b.alloc(params // layers, []) for _ in range(layers)]
        kept = [x, out]
    raise AssertionError("unreachable")


def leak_until_oom(steps: int = 8, kept: int = 48 * MiB) -> tuple[SnapshotBuilder, dict[str, Any]]:
    """`outputs.append(model(x))` (train.py:24) keeps each step's forward output (`kept` bytes,
    allocated inside the model's forward: activations) alive until forward runs out of memory: the
    leak holds most of it."""
    b = SnapshotBuilder()
    b.step(0)
    params, layers, activation = 8 * MiB, 4, 64 * MiB
    for _ in range(layers):
        b.alloc(params // layers, to_device(12))
    grads: list[int] = []
    for step in range(steps + 1):
        b.step(step)
        acts = [b.alloc(activation // layers, forward(20 + i)) for i in range(layers)]
        if step == steps:
            request = 256 * MiB
            b.oom(request, MiB, forward(24))
            info = {
                "step": steps,
                "phase": "forward",
                "requested_bytes": request,
                "device_total_bytes": 8 << 30,
            }
            info["device_free_bytes"] = MiB
            return b, info
        b.alloc(kept, forward(24))  # kept in the list: never freed
        for a in reversed(acts):
            b.free(a)
        for g in grads:
            b.free(g)
        grads = [b.alloc(params // layers, []) for _ in range(layers)]
    raise AssertionError("unreachable")


# -- snapshots the size of a long job's, shaped like torch's
# ---------------------------------------------------------
def torch_shaped(
    events: int, stack_depth: int = 12, sites: int = 300, device: int = 0
) -> dict[str, Any]:
    """A snapshot laid out as torch 2.11 writes one (the H200 snapshot in /work/shared/snapshots,
    and tests/data/gpu): every event and block has its own frames list of its own frame dicts (torch
    shares the strings, not the dicts), keys in torch's order, steps tagged, with
    `allocator_settings`, `external_annotations` and stepcli's record. `events` allocator events
    (alloc / free_requested / free_completed, a segment_alloc per 64 allocations, an oom at the end)
    from `sites` call sites whose stacks are up to `stack_depth` frames: about 200 bytes of pickle
    an event at the default depth."""
    torch_files = [
        f"{TORCH}/nn/modules/{name}.py" for name in ("module", "linear", "container", "activation")
    ]
    names = [
        "forward",
        "_call_impl",
        "_wrapped_call_impl",
        "relu",
        "convert",
        "_apply",
        "step",
        "_init_group",
    ]

    def stack(site: int) -> list[tuple[str, str, int]]:
        depth = 1 + (site * 7) % stack_depth
        inner = [
            (
                names[(site + k) % len(names)],
                torch_files[(site + k) % 4],
                100 + (site * 13 + k) % 1700,
            )
            for k in range(depth - 1)
        ]
        return [*inner, ("<module>", SCRIPT, 10 + site)]

    stacks = [stack(s) for s in range(sites)]

    # new dicts, shared strings: what torch's frame symbolizer returns
    def frames(site: int) -> Frames:
        return [{"name": n, "filename": f, "line": line} for n, f, line in stacks[site]]

    trace: list[dict[str, Any]] = []
    live: list[tuple[int, int, int]] = []
    address, base, time_us, step, allocations = (
        0x7F0000000000,
        0x7F0000000000,
        1_795_760_558_917_849,
        0,
        0,
    )
    tags = [f"stepcli:step={n}" for n in range(events // 1000 + 2)]
    while len(trace) < events - 1:
        time_us += 11
        if len(trace) % 1000 == 0:
            step += 1
        common = {
            "stream": 0,
            "time_us": time_us,
            "compile_context": "N/A",
            "user_metadata": tags[step],
        }
        if live and (len(live) > 64 or allocations % 3 == 2):
            addr, size, site = live.pop(0)
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {"action": action, "addr": addr, "size": size, **common, "frames": frames(site)}
                )
            allocations += 1
            continue
        allocations += 1
        site = (allocations * 31) % sites
        size = 512 << (allocations % 12)
        if allocations % 64 == 1:
            trace.append(
                {
                    "action": "segment_alloc",
                    "addr": base,
                    "size": 2 * MiB,
                    **common,
                    "frames": frames(site),
                }
            )
            base += 2 * MiB
        address += size
        live.append((address, size, site))
        trace.append(
            {"action": "alloc", "addr": address, "size": size, **common, "frames": frames(site)}
        )
    common = {
        "stream": 0,
        "time_us": time_us + 1,
        "compile_context": "N/A",
        "user_metadata": tags[step],
    }
    trace.append(
        {"action": "oom", "device_free": MiB, "size": 1 << 34, **common, "frames": frames(0)}
    )
    blocks = [
        {
            "address": addr,
            "size": size,
            "requested_size": size,
            "state": "active_allocated",
            "frames": frames(site),
        }
        for addr, size, site in live
    ]
    segment = {
        "device": device,
        "address": 0x7F0000000000,
        "total_size": 1 << 40,
        "allocated_size": sum(b["size"] for b in blocks),
        "active_size": sum(b["size"] for b in blocks),
        "requested_size": sum(b["size"] for b in blocks),
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "blocks": blocks,
        "frames": frames(1),
    }
    annotations = [
        {"stage": stage, "name": f"ProfilerStep#{n}", "device": device, "time_us": n}
        for n in range(step)
        for stage in ("START", "END")
    ]
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
    }
    settings["roundup_power2_divisions"] = {str(1 << n): 0 for n in range(16)}
    record = {
        "version": 1,
        "step": step,
        "phase": "forward",
        "device": device,
        "requested_bytes": 1 << 34,
    }
    record.update(
        device_total_bytes=150 << 30, device_free_bytes=MiB, pid=644, argv=["/work/train.py"]
    )
    return {
        "segments": [segment],
        "device_traces": [trace],
        "allocator_settings": settings,
        "external_annotations": annotations,
        "stepcli": record,
    }
