"""pronk's data plane: engine workers, their registry, and the router. Never imports Prefect."""
