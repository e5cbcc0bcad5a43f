"""Reaching into a job while it runs: `stepcli capture` (a window, stacks or a memory snapshot on
demand; captureplan places the window), `stepcli top`, the hang doctor's launcher side (hangdoctor)
and finding the run a TARGET names (liverun), all through the run's private control folder
(stepcli.run.controldir).

May import: stepcli.run.summary (the hang section it reports), stepcli.run.controldir and
stepcli.run.subreaper, the agent's shared constants, the traces and the shared leaves; never the
launcher.
"""
