"""Test support shipped with the package: the simulated upstream model server."""

from .sim_responders import ToolRoundTrip
from .simulator import Fault, RecordedRequest, Simulator, run_simulator, serve_simulator

__all__ = [
    "Fault",
    "RecordedRequest",
    "Simulator",
    "ToolRoundTrip",
    "run_simulator",
    "serve_simulator",
]
