"""prism-limits: rate limits and budgets per key and organisation, exact across the fleet."""
