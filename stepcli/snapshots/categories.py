"""What a block of memory is, from the Python stack that allocated it: the split rules
docs/commands/memory.md documents.

Checked in this order, the first that matches wins (frames are innermost first, as torch records
them):

1. optimizer state: a frame in an optimizer package (a path containing `/optim/` or `/optimizers/`:
   torch.optim, torch.distributed.optim, bitsandbytes.optim, apex.optimizers).
2. gradients: a frame of autograd's entry points (`backward`, `_engine_run_backward`,
   `run_backward`, `grad` in torch/autograd or torch/_tensor.py), or no Python stack at all on an
   allocation stepcli tagged with a step: autograd's device threads, which run the backward pass on
   CUDA, have no Python frames.
3. parameters: a frame that creates or moves module state: torch/nn/parameter.py, torch/nn/init.py,
   in torch/nn/modules/module.py `_apply`, `to`, `cuda`, `to_empty`, `load_state_dict`,
   `_load_from_state_dict`, or a module's `__init__` / `reset_parameters` under torch/nn/modules/.
4. activations: a frame of a module's forward call (`_call_impl`, `_wrapped_call_impl` in
   torch/nn/modules/module.py), torch/nn/functional.py or torch/utils/checkpoint.py.
5. other: everything else (input batches, the program's own tensors, memory with no stack).
"""

from __future__ import annotations

from stepcli.snapshots.snapshotreader import HistoryFrame, Stack

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "other": "other",
}
PHASES = ("forward", "backward", "optimizer", "other")

_BACKWARD = frozenset({"backward", "_engine_run_backward", "run_backward", "grad"})
_MODULE_STATE = frozenset(
    {"_apply", "to", "cuda", "to_empty", "load_state_dict", "_load_from_state_dict"}
)
_MODULE_CALL = frozenset({"_call_impl", "_wrapped_call_impl"})


def _path(frame: HistoryFrame) -> str:
    return frame.filename.replace("\\", "/")


def is_optimizer(frame: HistoryFrame) -> bool:
    path = _path(frame)
    return "/optim/" in path or "/optimizers/" in path


def is_backward(frame: HistoryFrame) -> bool:
    path = _path(frame)
    return frame.name in _BACKWARD and ("/torch/autograd/" in path or "/torch/_tensor" in path)


def is_module_state(frame: HistoryFrame) -> bool:
    path = _path(frame)
    if path.endswith(("/torch/nn/parameter.py", "/torch/nn/init.py")):
        return True
    if path.endswith("/torch/nn/modules/module.py"):
        return frame.name in _MODULE_STATE
    return "/torch/nn/modules/" in path and frame.name in ("__init__", "reset_parameters")


def is_forward(frame: HistoryFrame) -> bool:
    path = _path(frame)
    if path.endswith("/torch/nn/modules/module.py"):
        return frame.name in _MODULE_CALL
    return path.endswith(("/torch/nn/functional.py", "/torch/utils/checkpoint.py"))


def category(stack: Stack, tagged: bool) -> str:
    """The split category of memory allocated with `stack`; `tagged`: stepcli knew the step it was
    made in."""
    if not stack:
        return "gradients" if tagged else "other"
    if any(is_optimizer(f) for f in stack):
        return "optimizer_state"
    if any(is_backward(f) for f in stack):
        return "gradients"
    if any(is_module_state(f) for f in stack):
        return "parameters"
    if any(is_forward(f) for f in stack):
        return "activations"
    return "other"


def phase(stack: Stack) -> str:
    """forward, backward, optimizer or other: the part of a training step that made an
    allocation."""
    if any(is_optimizer(f) for f in stack):
        return "optimizer"
    if any(is_backward(f) for f in stack):
        return "backward"
    if any(is_forward(f) for f in stack):
        return "forward"
    return "other"


def site(stack: Stack) -> tuple[HistoryFrame | None, HistoryFrame | None]:
    """(the program's own frame closest to the allocation, the innermost frame when that differs):
    the first frame outside torch's package, so a site names the line of the program that asked for
    the memory."""
    if not stack:
        return None, None
    innermost = stack[0]
    for frame in stack:
        path = _path(frame)
        if "/torch/" not in path and not path.startswith("<"):
            return frame, (innermost if frame is not innermost else None)
    return innermost, None
