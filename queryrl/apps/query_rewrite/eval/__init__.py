"""``queryrl eval``: generating with each system, retrieving, judging, paired comparisons and the outputs."""
