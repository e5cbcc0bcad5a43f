"""The run folder's layout and file formats, in one place: every folder and file name, suffix, trace
metadata key and schema version that `stepcli run`, its agent and the readers share.

`<out>/.stepcli/<run-id>/` holds one run's step logs, step records, hello files, summary and control
folder (docs/architecture.md, "The run folder"). The agent writes these files inside the profiled
process and the readers read them back in stepcli's: both take the names from here, so a name is
changed once. Runs inside the target too (the agent imports it): standard library only, nothing but
`os`.
"""

from __future__ import annotations

import os

# The hidden folder of stepcli's own records in an output folder: trace viewers and `stepcli table
# DIR` skip it.
RUN_FOLDER = ".stepcli"

# In `<out>/.stepcli/<run-id>/`:
# <host>.<pid>.steps.json: a process's step log (stepcli.agent.steplogwriter)
STEP_LOG_SUFFIX = ".steps.json"
STEP_LOG_VERSION = 1  # the step log's schema_version (stepcli.runfolder.steplogreader checks it)
# <host>.<pid>.steptimes.json: the whole run's step times (agent.steprecord)
STEP_RECORD_SUFFIX = ".steptimes.json"
STEP_RECORD_SCHEMA = "stepcli.steptimes/1"
# the record's histogram: log buckets, this many per doubling of a step time
STEP_RECORD_BUCKETS_PER_DOUBLING = 8
HELLO_PREFIX = "hello."  # hello.<pid>.json: the launcher's own child ran (stepcli.agent.runtime)
# written by `stepcli run` next to the step logs, so `stepcli report DIR` has it all
SUMMARY_FILE = "summary.json"
SUMMARY_SCHEMA = "stepcli.run"  # the run summary document (stepcli.runfolder.summaryfile)
# 2: run_id and step_times (every step of every process); readers still accept 1
SUMMARY_VERSION = 2
SUMMARY_READABLE_VERSIONS = (1, 2)
# the step logs' and step records' signature with the run key (stepcli.agent.signing)
SIGNATURE_KEY = "signature"
NO_CUDA_MARKER = "memory-no-cuda"  # --memory: the first process to find no CUDA says so, once

# The control folder `<out>/.stepcli/<run-id>/control/` (docs/architecture.md, "The control-folder
# protocol"):
CONTROL_FOLDER = "control"
RUN_FILE = "run.json"  # the launcher: the run is alive
REQUESTS_FILE = "requests.json"  # capture: requests and pings
LOCK_FILE = "capture.lock"  # one capture (or slow trigger) at a time edits requests.json
PROC_PREFIX = "proc."  # proc.<host>.<pid>.json: a stepping process's heartbeat and answers
REGISTER_PREFIX = "stacks."  # stacks.<host>.<pid>.json: a process that can dump its stacks
STALL_PREFIX = "stall."  # stall.<host>.<pid>.json: --hang-timeout, no step for that long
REQUEST_PREFIX = "dump."  # dump.<id>.json: where to write the stacks, before the dump signal
# the launcher's: {"id"}; a woken thread answers in alive.<host>.<pid>.json
PROBE_FILE = "probe.json"
ALIVE_PREFIX = "alive."
# fault.<host>.<pid>.txt: faulthandler's text for the fault signal, appended by C
FAULT_PREFIX = "fault."
STACKS_SCHEMA = "stepcli.stacks"
MEMORY_ANSWER_SCHEMA = "stepcli.memory-answer"  # a process's answer to `capture --memory-snapshot`

# In the output folder itself, beside the traces:
# window-step<N>/: one folder per window when a process records several
WINDOW_FOLDER_PREFIX = "window-step"
# With --with-flops, beside each trace `NAME.pt.trace.json[.gz]`: `NAME.flops`, the window's FLOPs
# from key_averages() (torch puts none into the exported trace on CPU), read back by
# stepcli.traces.analyses.flops. The name ends in neither .json nor holds .pt.trace.json, so nothing
# that lists traces takes it for one.
FLOPS_SUFFIX = ".flops"
# --memory: oom-<worker>-<n>.pickle, the CUDA memory snapshot at an out-of-memory error
SNAPSHOT_PREFIX = "oom-"
ON_DEMAND_PREFIX = "memory-"  # `stepcli capture --memory-snapshot`: memory-<worker>-<n>.pickle
SNAPSHOT_SUFFIX = ".pickle"
# extra top-level key of the pickled snapshot: step, phase, rank, the failed request
SNAPSHOT_KEY = "stepcli"

# Top-level trace metadata keys the agent writes into its traces. Into a trace whose window was cut
# short: the ProfilerStep#N that only just began (stepcli.traces.read.tracereader reads it).
INCOMPLETE_STEP_KEY = "stepcli_incomplete_step"
# ... and into every trace: the clock its times come from ("HOST BOOT_ID": processes of one boot of
# one machine share it), so the culprit analysis aligns only ranks of different machines
# (stepcli.traces.analyses.culprit).
CLOCK_KEY = "stepcli_clock"
# ... and per recorded step, the steps' thread's time on a CPU and time waiting for one, ms ({"12":
# [3.1, 0.4]}: stepcli.agent.cpuwait).
CPU_TIME_KEY = "stepcli_cpu_ms"
# The trace annotation around each call of an optimizer's closure (`optimizer.step(closure)`, as
# LBFGS takes), written while a stepcli window records (stepcli.agent.patches): the forward and
# backward the closure runs are forward and backward, not optimizer (stepcli.traces.analyses.steps
# reads it back).
CLOSURE_ANNOTATION = "stepcli: optimizer closure"


def runs_dir(out_dir: str) -> str:
    """`<out>/.stepcli/`: every run's own folder is inside."""
    return os.path.join(out_dir, RUN_FOLDER)


def run_dir(out_dir: str, run_id: str) -> str:
    """`<out>/.stepcli/<run-id>/`: one run's step logs, step records, hello files and summary."""
    return os.path.join(out_dir, RUN_FOLDER, run_id)


def control_dir(out_dir: str, run_id: str) -> str:
    """`<out>/.stepcli/<run-id>/control/`: how anything outside the program talks to its
    processes."""
    return os.path.join(out_dir, RUN_FOLDER, run_id, CONTROL_FOLDER)


def out_of_control_dir(control: str) -> str:
    """The output folder a control folder `<out>/.stepcli/<run-id>/control/` belongs to ("." for a
    relative `.stepcli/<run-id>/control`, as pathlib says it)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(control))) or os.curdir


def flops_path(trace: str) -> str:
    """The FLOPs side file of a trace: `NAME.flops` beside `NAME.pt.trace.json[.gz]`."""
    at = trace.rfind(".pt.trace.json")
    return (trace[:at] if at >= 0 else trace) + FLOPS_SUFFIX
