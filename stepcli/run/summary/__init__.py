"""What a run says when it ends: the run summary document built from the step logs and the traces
(build, with steplogreader, recordreader, compilesteps, culpritsection, hangreport, hta), shown on
the terminal (console), and the inputs of the HTML page (htmlreport: `stepcli report PATH`,
report.html at the run's end).

May import: stepcli.advice, stepcli.runfolder.summaryfile, stepcli.steptimes, stepcli.traces,
stepcli.report, the agent's shared constants and the shared leaves; nothing else of stepcli.run.
"""
