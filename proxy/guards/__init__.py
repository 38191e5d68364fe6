"""Guards: rate limits (refuse a request before any work is done for it) and the guard, what
may pass between the agent and the provider: secrets scrubbed on the way up and given back on
the way down (secrets/), the model's tool calls judged on the way down (tool_rules.py), both
reported the same way, applied or dry run (mode.py). The chain's hook for the secrets is
proxy/pipeline/scrub.py; the wires apply the verdicts and give the secrets back."""
