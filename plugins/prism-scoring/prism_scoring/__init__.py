"""prism-scoring: consecutive chain lines with the same ``group`` are ordered per call by score."""

from .plugin import ORDER_NAME, GroupOrder, order_of
from .scores import Scores, Stat, draw_order, scores_of
from .settings import Line, Settings

__all__ = [
    "ORDER_NAME",
    "GroupOrder",
    "Line",
    "Scores",
    "Settings",
    "Stat",
    "draw_order",
    "order_of",
    "scores_of",
]
