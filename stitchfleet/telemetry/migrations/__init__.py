"""Alembic migrations of the telemetry schema, shipped inside the package (see database.py)."""
