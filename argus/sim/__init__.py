"""Cluster simulator: synchronous LLM training with natural variance and injected faults."""

from argus.sim.config import SimConfig, default_layout
from argus.sim.engine import Engine
from argus.sim.run import TRUTH_FILE, SimulationResult, prepare, simulate_to_store
from argus.sim.scenarios import SCENARIOS, Scenario, get_scenario

__all__ = ["Engine", "SCENARIOS", "Scenario", "SimConfig", "SimulationResult", "TRUTH_FILE", "default_layout",
           "get_scenario", "prepare", "simulate_to_store"]
