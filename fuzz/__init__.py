"""Hypothesis campaigns over the reference and the fast path (``python -m fuzz``)."""
