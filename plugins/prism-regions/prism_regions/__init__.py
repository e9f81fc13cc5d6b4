"""prism-regions: each organisation's calls are served only from the regions it allows."""

from .plugin import HEADER, POLICY_NAME, RegionPolicy, policy_of
from .settings import SETTING, Settings, parse_regions, regions_of

__all__ = [
    "HEADER",
    "POLICY_NAME",
    "SETTING",
    "RegionPolicy",
    "Settings",
    "parse_regions",
    "policy_of",
    "regions_of",
]
