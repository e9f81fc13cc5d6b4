"""prism-admin: the admin API over HTTP, under ``/prism/admin/``."""

from .routes import ROUTES, Route

__all__ = ["ROUTES", "Route"]
