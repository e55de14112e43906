"""pronk's data plane (`pronk.engine`, from the repository's engine/ folder): engine workers, their registry, and the
router. Never imports Prefect, MLflow or the rest of pronk."""
