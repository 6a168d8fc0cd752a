"""``python -m reference``: the reference's command line (``reference.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
