"""OpenAI Chat Completions: the proxy's lingua franca (the stages rewrite chat-shaped requests)."""
