"""Jobs: a job is a model plus its configuration. `schema` holds a job file's models (importable everywhere),
`catalog` reads the job files and resolves a job once, at an entry point (the API, the command line, a flow's top,
a worker's start), `sections` merges job mappings (and migrates the flat format of before sections), and `versions`
keeps the Herd's configuration versions of a job, which `catalog.resolve_job` applies over the job file."""
