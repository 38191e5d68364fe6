"""The guard: what may pass between the agent and the provider (docs/policies.md, Guard)."""
