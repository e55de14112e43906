"""`/v1/files`: OpenAI's Files resource. `routes` (the router), `wire` (its request and response bodies) and
`serving` (what the routes do, over `pronk.batches.file_store`)."""
