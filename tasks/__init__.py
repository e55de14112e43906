"""The Prefect steps of pronk's flows (`pronk.tasks`, from the repository's tasks/ folder), one module per flow."""
