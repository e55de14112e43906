"""The request vocabulary every layer above it shares (as vLLM's `protocol.py`): OpenAI batch lines and chat bodies,
the agent fields of a line (tools, tool choice, harness limits), replay lines and their trace shapes, output and error
lines, error codes and ids. Below both `pronk.agents` and `pronk.batches`; it imports neither.
"""
