"""stepcli: profile unmodified PyTorch programs on a step schedule.

Imported inside profiled processes too, so it must import nothing.
"""

__version__ = "0.1.0"
