"""`python -m ember ...`: the command line (ember.cli)."""

import sys

from .cli import main

sys.exit(main())
