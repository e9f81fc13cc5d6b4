"""prism-cache: an exact-match response cache for Prism, off unless configured."""
