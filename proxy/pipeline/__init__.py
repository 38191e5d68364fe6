"""History rewriting stages, one per module; chain.py runs them in order."""
