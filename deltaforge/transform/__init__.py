"""Batch transforms on Spark: processor specs, events as Arrow, the session, the plan."""
