"""`python -m deepjit ...`: see deepjit.cli."""

import sys

from .cli import main

sys.exit(main())
