"""Test support shipped with the package: the simulated upstream model server."""

from .sim_llama import LlamaCppSimulator
from .sim_responders import ForgetfulSummarizer, ToolRoundTrip
from .simulator import Fault, RecordedRequest, Simulator, run_simulator, serve_simulator

__all__ = [
    "Fault",
    "ForgetfulSummarizer",
    "LlamaCppSimulator",
    "RecordedRequest",
    "Simulator",
    "ToolRoundTrip",
    "run_simulator",
    "serve_simulator",
]
