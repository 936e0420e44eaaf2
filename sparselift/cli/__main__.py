"""`python -m sparselift.cli`: the same as the `sparselift` command."""

import sys

from sparselift.cli import main

sys.exit(main())
