"""Long Hypothesis campaigns (``python -m fuzz``); see the fuzzing issue."""
