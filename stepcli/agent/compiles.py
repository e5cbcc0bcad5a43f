"""torch.compile time, attributed to the steps where it happened: frames compiled, recompilations
with their reason, graph breaks, and the wall time spent compiling.

Runs inside the target: standard library only. Nothing here imports torch._dynamo: the agent
attaches only once the program has imported it (a post-import hook), through what torch exposes: the
compile start/end callbacks of `torch._dynamo.callback_handler` (outermost compile only, so nested
compiles are not counted twice), the `CompilationMetrics` records of
`torch._dynamo.utils.get_compilation_metrics()` (frame name, recompile reason), and the
`graph_break` counter. Nothing runs per step: only when torch compiles.
"""

from __future__ import annotations

import sys
import threading
import time

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from .tracker import StepTracker

_MAX_EVENTS = 1000  # a program that recompiles every step must not grow the step log without bound
_MAX_REASON = 300


class CompileWatcher:
    """Collects one record per compile (torch's outermost compile callback pair), keyed by global
    step."""

    def __init__(self, tracker: StepTracker) -> None:
        self.tracker = tracker
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self._open: tuple[float, int] | None = None
        # (compile id, is forward) -> event without details
        self._waiting: dict[tuple[str, bool], dict[str, Any]] = {}
        self._seen_records: set[int] = set()
        # compile id -> frame name (a lazy backward shares its forward's id)
        self._frames: dict[str, str] = {}
        self._graph_breaks = 0
        self._lock = threading.Lock()
        self._dynamo: ModuleType | None = None

    # -- torch's callbacks
    # ------------------------------------------------------------------------------------
    def attach(self, dynamo: ModuleType) -> None:
        """Register with torch._dynamo (just imported by the program); re-register after
        `torch._dynamo.reset()`, which clears every callback."""
        self._dynamo = dynamo
        self._graph_breaks = self._graph_break_total()
        self._register()
        original_reset = getattr(dynamo, "reset", None)
        if original_reset is None or getattr(original_reset, "_stepcli", False):
            return
        watcher = self

        def stepcli_dynamo_reset(*args: Any, **kwargs: Any) -> Any:
            try:
                return original_reset(*args, **kwargs)
            finally:
                watcher._graph_breaks = watcher._graph_break_total()
                watcher._register()

        stepcli_dynamo_reset._stepcli = True  # type: ignore[attr-defined]
        stepcli_dynamo_reset.__doc__ = original_reset.__doc__
        # mypy: ModuleType has no .reset
        setattr(dynamo, "reset", stepcli_dynamo_reset)  # noqa: B010

    def _register(self) -> None:
        handler = getattr(self._dynamo, "callback_handler", None)
        if handler is None:
            return
        if self._on_start not in handler.start_callbacks:
            handler.register_start_callback(self._on_start)
        if self._on_end not in handler.end_callbacks:
            handler.register_end_callback(self._on_end)

    def _on_start(self, args: Any) -> None:
        try:
            self._open = (time.perf_counter(), self.tracker.global_step)
        except Exception:
            pass

    def _on_end(self, args: Any) -> None:
        try:
            self._record(args)
        except Exception:  # a change in torch's internals must never break the program's compile
            pass

    def _record(self, args: Any) -> None:
        opened, self._open = self._open, None
        if opened is None:
            return
        started, step = opened
        trigger = getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")
        compile_id = str(getattr(args, "compile_id", ""))
        total = self._graph_break_total()
        breaks, self._graph_breaks = max(0, total - self._graph_breaks), total
        event: dict[str, Any] = {
            "step": step,
            "kind": "backward"
            if trigger == "LAZY_BACKWARD"
            else "compiled"
            if trigger == "DYNAMO"
            else trigger.lower(),
            "frame": None,
            "seconds": round(time.perf_counter() - started, 6),
            "graph_breaks": breaks,
        }
        with self._lock:
            if len(self.events) >= _MAX_EVENTS:
                self.dropped += 1
                return
            self.events.append(event)
            if trigger in ("DYNAMO", "LAZY_BACKWARD"):
                event["frame"] = self._frames.get(compile_id)
                self._waiting[(compile_id, trigger == "DYNAMO")] = event
                event["_id"] = compile_id
        self.collect()

    # -- details from torch's compile-time records
    # ------------------------------------------------------------
    def collect(self) -> None:
        """Fill in frame names and recompile reasons from torch's CompilationMetrics records.

        A record is appended after the end callback of its own compile (forward) or before it (lazy
        backward), so this runs at every compile end and once more when the step log is written."""
        utils = sys.modules.get("torch._dynamo.utils")
        get_records = getattr(utils, "get_compilation_metrics", None)
        if get_records is None or not self._waiting:
            return
        try:
            records = get_records()
        except Exception:
            return
        with self._lock:
            for record in records:
                if id(record) in self._seen_records:
                    continue
                key = (
                    str(getattr(record, "compile_id", "")),
                    getattr(record, "is_forward", True) is not False,
                )
                event = self._waiting.pop(key, None)
                if event is None:
                    continue
                self._seen_records.add(id(record))
                if getattr(record, "co_name", None):
                    event["frame"] = self._frames[key[0]] = str(record.co_name)
                    # its backward, compiled earlier than this record arrived
                    for other in self.events:
                        if other.get("_id") == key[0] and other["frame"] is None:
                            other["frame"] = event["frame"]
                reason = getattr(record, "recompile_reason", None)
                if reason:
                    event["kind"] = "recompiled"
                    event["reason"] = _short_reason(str(reason))
                if getattr(record, "fail_type", None):
                    event["failed"] = str(record.fail_type)

    def _graph_break_total(self) -> int:
        counters = getattr(sys.modules.get("torch._dynamo.utils"), "counters", None)
        try:
            return int(sum(counters["graph_break"].values())) if counters is not None else 0
        except Exception:
            return 0

    def to_log(self) -> dict[str, Any]:
        """The step log's `compile` section: every compile event, in order."""
        self.collect()
        with self._lock:
            events = [{k: v for k, v in e.items() if not k.startswith("_")} for e in self.events]
            return {"events": events, "dropped": self.dropped}


def _short_reason(reason: str) -> str:
    """torch's first guard failure, e.g. "tensor 'x' size mismatch at index 0. expected 8, actual
    12", without the "0/0: " compile-id prefix, on one line."""
    first = reason.strip().splitlines()[0] if reason.strip() else reason
    head, sep, rest = first.partition(": ")
    if sep and head.replace("/", "").isdigit():
        first = rest
    return first if len(first) <= _MAX_REASON else first[: _MAX_REASON - 1] + "…"
