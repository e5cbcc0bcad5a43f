"""`python -m stepcli`."""

import sys

from stepcli.cli import main

sys.exit(main())
