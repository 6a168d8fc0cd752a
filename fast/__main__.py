"""``python -m fast``: decode a saved case on N ranks, or the demo (``fast.tools.cli``)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
