"""The guard: what may pass between the agent and the provider (secrets scrubbed on the way
up and given back on the way down)."""
