"""``python -m fast``: the demo, the bench and the launcher (``fast.tools.cli``)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
