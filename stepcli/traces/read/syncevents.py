"""The profiler's CUDA sync events (`cuda_sync`, recorded with enable_cuda_sync_events) of one
trace: the cross-stream waits the what-if graph needs (stepcli.traces.analyses.devicework). The
column reader keeps no `cuda_sync` event (they are zero-length marks on the device's rows, no
operator or kernel any analysis counts), so they are found in the text itself, only in a trace that
has them: few events, decoded one by one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from stepcli.traces.read.tracereader import Text


@dataclass
class StreamWait:
    """A cross-stream wait from the profiler's CUDA sync events: the `cudaStreamWaitEvent` call
    (correlation `wait_corr`) made stream `stream` wait for what was queued before the
    `cudaEventRecord` (`record_corr`)."""

    wait_corr: int
    record_corr: int
    stream: int
    record_stream: int = -1  # the stream the event was recorded on (-1: not said)


_CATEGORY = re.compile(rb'"cat"\s*:\s*"cuda_sync"')


def stream_waits(data: Text) -> list[StreamWait]:
    """The `Stream Wait Event` marks of the trace text `data` (an empty list when it has no CUDA
    sync events)."""
    found: list[StreamWait] = []
    decoder = json.JSONDecoder()
    for match in _CATEGORY.finditer(data):
        opening = data.rfind(b"{", 0, match.start())
        if opening < 0:
            continue
        piece = bytes(data[opening : opening + 4096]).decode("utf-8", "replace")
        try:
            event, _ = decoder.raw_decode(piece)
        except ValueError:
            continue
        args = event.get("args") if isinstance(event, dict) else None
        if (
            not isinstance(args, dict)
            or args.get("cuda_sync_kind", event.get("name")) != "Stream Wait Event"
        ):
            continue
        try:
            found.append(
                StreamWait(
                    int(args["correlation"]),
                    int(args["wait_on_cuda_event_record_corr_id"]),
                    int(args["stream"]),
                    int(args.get("wait_on_stream", -1)),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return found
