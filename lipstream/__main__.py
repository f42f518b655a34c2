"""`python -m lipstream` runs the CLI."""

import sys

from lipstream.cli import main

sys.exit(main())
