"""`python -m artifacts.client`: see artifacts/client/cli.py."""

import sys

from .cli import main

sys.exit(main())
