"""Trace files -> summaries: everything `stepcli table` does, and what the run summary and report read.

Owns reading Kineto/Chrome traces (reader, columns, splitread; on two cores: twoprocess, readahead, forked), the
operator analysis (arrays, summary), reading many files (engine, cluster), per-rank and share figures (ranks,
shares), memory curves (memory), the run end's single read of its traces (readonce), and rendering of `table`
(render).
May import: stepcli.errors, stepcli.fmt, stepcli.inputs, stepcli.stats; of agent/ only agent.config, for the
constants of the files the agent writes (the incomplete-step metadata key). Never run/, compare/ or report/.
"""
