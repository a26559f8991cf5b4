"""`python -m extender.cli ...`: the `tessera` command without the installed entry point (the tests run it so)."""

import sys

from . import main

sys.exit(main())
