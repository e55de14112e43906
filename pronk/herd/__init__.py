"""Herd: profile a job's real traffic, replay it against candidate configurations, apply the winner."""
