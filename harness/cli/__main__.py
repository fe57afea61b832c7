"""`python -m harness.cli`: how the harness starts itself in another environment (a reward server, an A/B arm)."""

import sys

from harness.cli import main

sys.exit(main())
