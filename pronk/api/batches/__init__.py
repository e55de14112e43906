"""`/v1/batches`: OpenAI's Batches resource, addressed to jobs. `routes` (the router), `wire` (its request and
response bodies), `serving` (what the routes do: choose the job, record the batch, page, cancel), and what keeps the
API's batches running: `drainers` (the batch queue's drainer, started as batches are queued), `flow_runs` (the
deployment runs the API starts and what Prefect knows of them) and `reconcile` (no batch outlives its flow run
unended)."""
