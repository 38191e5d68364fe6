"""AgentProxy: an OpenAI-compatible proxy that repairs, compacts and governs AI agent traffic."""

__version__ = "0.1.0"
