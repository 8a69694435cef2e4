"""Discrete-event simulator: replays a workload through a policy on a simulated cluster."""

from argusdiff.simulator.engine import SimConfig, SimResult, Simulator, simulate
from argusdiff.simulator.faults import Fault, parse_faults
from argusdiff.simulator.metrics import minute_metrics, summarize
from argusdiff.simulator.workload import Workload, build_workload, quick_workload

__all__ = [
    "Fault",
    "SimConfig",
    "SimResult",
    "Simulator",
    "Workload",
    "build_workload",
    "minute_metrics",
    "parse_faults",
    "quick_workload",
    "simulate",
    "summarize",
]
