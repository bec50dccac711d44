"""``python -m s3stream``: the command line."""

import sys

from .cli import main

sys.exit(main())
