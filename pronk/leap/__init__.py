"""Leap: swap a job's running fleet to an MLflow model version in place, its canary, its records and its API bodies."""
