"""Secrets: what one looks like (patterns.py), the placeholder it becomes (placeholders.py),
a turn's scan (scrubber.py), the answer given back (restore.py), and what a recording keeps
(recorded.py)."""
