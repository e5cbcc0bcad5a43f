"""Temporary alias of the modules `summary` was split into (model, analysis): branches written before the split
still import from here. Import from stepcli.traces.model / stepcli.traces.analysis; remove once they are merged."""

from stepcli.traces.analysis import merge_parts, summarize, summarize_columns, summarize_file, summarize_read
from stepcli.traces.model import FilePart, TraceSummary

__all__ = [
    "FilePart",
    "TraceSummary",
    "merge_parts",
    "summarize",
    "summarize_columns",
    "summarize_file",
    "summarize_read",
]
