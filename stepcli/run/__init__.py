"""`stepcli run` and `stepcli capture`, from the launcher's side: everything outside the profiled process.

Owns the child command and its signals (launcher, signals, watchdog), the run's private control folder
(controldir), the step logs the agent writes (steplogs), on-demand capture of a running job (capture; liverun finds
the run a TARGET names, captureplan places the window), hang dumps (hang, hangreport), building the run summary
document and its advice (summary, compiles, advice, deviceadvice, advising, hta, guard), showing it on the terminal
(console), and the inputs of the HTML page (htmlreport: `stepcli report PATH`, report.html at the run's end).
May import: stepcli.errors, stepcli.fmt, stepcli.inputs, stepcli.stats, stepcli.runsummary, stepcli.steptimes,
stepcli.agent (its shared constants, config and output helpers), stepcli.traces, stepcli.compare (budgets) and
stepcli.report.
"""
