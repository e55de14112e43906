"""Prefect tasks used by pronk's flows."""
