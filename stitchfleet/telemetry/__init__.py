"""Telemetry: events, the SQLAlchemy store with Alembic migrations, spool, Prometheus, reports.

A leaf: imports nothing of compiler, plugin or operator. SQLAlchemy and
prometheus_client are imported lazily by the modules that own them.
"""
