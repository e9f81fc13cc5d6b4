"""The incident lab: replay incidents against real Prism gateways and measure them."""

from .scenario import Scenario, ScenarioError, load_scenario

__all__ = ["Scenario", "ScenarioError", "load_scenario"]
