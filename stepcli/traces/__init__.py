"""Trace files -> summaries: everything `stepcli table` does, and what the run summary and report
read.

Three layers, each importing only those below it:
- read/: the bytes of Kineto/Chrome traces -> events and typed columns (tracereader, columns; one
  large file on several cores: splitread, twoprocess, readahead, forked).
- analyses/: the figures computed over those columns (operators, steps, device classes, launches,
  collectives, arrivals and the culprit rank, FLOPs and MFU, ranks and shares) and the result types
  (results).
- render/: `stepcli table` on a terminal, and in JSON, CSV and Markdown.
Beside them, at this level: reading many files at once in worker processes (engine, forkmap,
cluster), the run end's single read of its traces (runtraces), memory curves (memorycurve) and
`stepcli merge` (mergetraces). May import: stepcli.errors, stepcli.fmt, stepcli.inputs,
stepcli.stats, stepcli.pipeconsole, stepcli.safefile; of agent/ only agent.config and
agent.tracenames, for the file format the agent writes. Never run/, compare/ or report/.
"""
