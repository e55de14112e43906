"""Jobs: a job is a model plus its configuration. `schema` holds a job file's models, `files` reads the job files
and the catalog, `sections` merges job mappings (and migrates the flat format of before sections), and `versions`
keeps the Herd's configuration versions of a job, which `files.get_job` applies over the job file."""
