"""`python -m bpdbench.cli`, the same as the `bpdbench` entry point."""
from __future__ import annotations

import sys

from . import main

sys.exit(main())
