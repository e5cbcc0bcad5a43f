"""`stepcli compare` and step-time budgets: is the current side slower than the baseline, or only
noise?

Owns loading each side (load) into what compare knows about it (measurement), the bootstrap
intervals and warm-up detection (inference), per-operator attribution (attribution), the verdict
rules (verdict, withoutinterval) and the result they build (comparison), the `--fail-over` budgets
`stepcli run` checks (budgets), compare's terminal and Markdown output (comparerender), and
comparemain, which wires them (its options: stepcli.commands.compare). May import: stepcli.errors,
stepcli.fmt, stepcli.inputs, stepcli.stats, stepcli.traces, stepcli.runfolder.summaryfile and
summaryread (the run summary document and its loader). Never run/, report/ or agent/.
"""
