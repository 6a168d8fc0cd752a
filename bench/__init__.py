"""The performance lab beside the runtime: ``make bench`` (``python -m bench``), its timing
harness and verdicts, the SASS and rate tools, the scorers' variants and the superseded prmt
scorer they are compared against, and the performance log (``PERF.md``, ``PERF-HISTORY.md``).

Not part of the installed wheel: a server imports ``fast`` alone, and nothing under ``fast/``
imports this package (``tests/test_rules.py`` holds it to that).
"""
