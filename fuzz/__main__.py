"""``python -m fuzz``: the fuzz campaigns, their smoke budget and the mutants (``fuzz.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
