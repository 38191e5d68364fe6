"""OpenAI Responses: its route, request view, replies, stream relay and native upstream."""
