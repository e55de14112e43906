"""pronk's Prefect flows, one per file."""
