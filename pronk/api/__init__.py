"""pronk's OpenAI-compatible HTTP API: Files and Batches (plus job addressing), one thin router per resource."""
