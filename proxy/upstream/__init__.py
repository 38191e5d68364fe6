"""Upstream providers: the OpenAI-compatible fast path and litellm for everything else."""
