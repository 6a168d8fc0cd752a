"""What a user runs around the runtime: ``python -m fast decode|demo`` (``cli``, ``demo``),
the rank launcher (``launcher``: CPU or GPU rank processes) and what each rank runs
(``programs``)."""
