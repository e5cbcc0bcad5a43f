"""Code that runs inside the profiled process. Standard library only (torch is the program's,
imported by it).

The bootstrap loads this package under a private name (`_stepcli_agent`) straight from its folder,
so it also works when the program runs in another Python environment where stepcli itself is not
installed. Importing the package does nothing; `runtime.activate()` starts the agent.

A module here that writes a file the launcher reads has one reader there, named for what it reads,
across the process boundary that this package may not cross: steprecord (read by
stepcli.runfolder.steprecordreader), compiles (stepcli.run.summary.compilesteps), the step logs'
format in config and output (stepcli.runfolder.steplogreader).
"""
