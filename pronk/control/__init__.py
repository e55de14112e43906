"""pronk's calls to the Prefect API that are not tasks: bounded best-effort calls, a run's artifacts, and the
trace-sample drawer that draws a finished batch's sampled traces in its flow run's graph."""
