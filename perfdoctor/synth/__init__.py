"""Scenario simulator: realistic Megatron training traces (nsys SQLite) with exact ground truth (DESIGN §7)."""

from perfdoctor.synth.run import run_scenario
from perfdoctor.synth.scenario import Scenario, load_scenario

__all__ = ["Scenario", "load_scenario", "run_scenario"]
