"""Alembic revision scripts; this file only makes the folder a package so it is installed."""
