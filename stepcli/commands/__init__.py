"""The command line: one module per `stepcli` command (run, demo, table, compare, whatif, capture,
top, memory, report, merge), each its click options, their checks and a short orchestration that
calls the package doing the work, imported only when the command runs (so `stepcli --help` stays
fast). Option values more than one command parses: params; the path parameter every command takes:
pathparam; `run --capture-on-slow`'s: slowoptions. stepcli.cli holds the group and maps errors to
exit codes; nothing else in stepcli imports click. May import: everything, thinly; never
stepcli.cli.
"""
