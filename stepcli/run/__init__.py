"""`stepcli run` and `stepcli capture`, from the launcher's side: everything outside the profiled process.

Owns the child command and its signals (launcher, watchdog), the run's private control folder (controldir), the
step logs the agent writes (steplogs), on-demand capture of a running job (capture; liverun finds the run a
TARGET names, captureplan places the window), hang dumps (hang, hangreport), the run summary document and its
advice (summary, compiles, advice, hta, guard).
May import: stepcli.errors, stepcli.fmt, stepcli.inputs, stepcli.stats, stepcli.agent (its shared constants, config
and output helpers),
stepcli.traces, stepcli.compare (budgets) and stepcli.report (the page written at the run's end).
"""
