"""Code that runs inside the profiled process. Standard library only (torch is the program's, imported by it).

The bootstrap loads this package under a private name (`_stepcli_agent`) straight from its folder, so it also
works when the program runs in another Python environment where stepcli itself is not installed.
Importing the package does nothing; `runtime.activate()` starts the agent.

A module here that writes a file the launcher reads shares its name with the launcher's module that reads it, one
concept on the two sides of the process boundary that this package may not cross: steprecord and compiles
(stepcli.run.summary.steprecord, .compiles), the step logs' format in config and output (stepcli.run.summary.steplogs).
"""
