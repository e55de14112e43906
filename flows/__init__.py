"""pronk's Prefect flows (`pronk.flows`, from the repository's flows/ folder), one per file."""
