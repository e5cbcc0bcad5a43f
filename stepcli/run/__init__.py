"""`stepcli run` and `stepcli capture`, from the launcher's side: everything outside the profiled
process.

At this level, the launch: the child command and its signals (launcher, signals, watchdog,
subreaper: no orphan outlives the run), the run's private control folder (controldir), and what
happens when the summary fails (summaryfallback). Below it:
- live/: reaching into the running job (capturewindow, liveview, the hang doctor: hangdoctor, memory
  snapshots);
- summary/: what the run says when it ends (the run summary, the terminal, report.html's inputs).
Advice rules are stepcli.advice's. May import: stepcli.errors, stepcli.fmt, stepcli.inputs,
stepcli.stats, stepcli.runfolder.summaryfile and summaryread, stepcli.steptimes, stepcli.agent (its
shared constants, config and output helpers), stepcli.traces, stepcli.advice, stepcli.compare
(budgets) and stepcli.report.
"""
