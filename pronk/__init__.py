"""pronk: async AI on persistent vLLM workers, orchestrated by Prefect.

One installed name: the repository's engine/, flows/ and tasks/ folders are this package's `pronk.engine`,
`pronk.flows` and `pronk.tasks`, through the links pronk/engine, pronk/flows and pronk/tasks (docs/layout.md,
"Packaging"). Importing `pronk` loads nothing else: the data plane imports `pronk.engine` without the domain.
"""
