"""Advice, in one place: pure rules over numbers a run or a snapshot already measured, each naming
its evidence and the threshold it crossed, and silent without them. The same advice reaches the
terminal, the JSON documents and report.html.

rules: the run's rules (data loading, garbage collection, recompiles, the culprit rank...);
deviceadvice: the GPU rules (exposed communication, a device waiting for its host, pageable copies);
memoryadvice: a CUDA memory snapshot's; gather: the evidence the run's rules read, gathered from the
run summary and the traces, and every rule applied. May import: stepcli.runfolder.summaryfile,
stepcli.steptimes, stepcli.traces and the shared leaves; never run/, report/ or snapshots/, which
use it.
"""
