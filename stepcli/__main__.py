"""`python -m stepcli`."""

from stepcli.cli import entry

entry()
