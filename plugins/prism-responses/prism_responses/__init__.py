"""prism-responses: the Responses API's conversation state in SQLite, PostgreSQL or Redis."""
