"""The simulated upstream that `agentproxy simulate` serves and `agentproxy demo` drives: one
model server speaking OpenAI chat, Anthropic Messages and OpenAI Responses, with their rules,
faults and caches. (Responders and variants only the tests use live in tests/support/.)"""

from .simulator import Fault, RecordedRequest, Simulator, run_simulator, serve_simulator

__all__ = [
    "Fault",
    "RecordedRequest",
    "Simulator",
    "run_simulator",
    "serve_simulator",
]
