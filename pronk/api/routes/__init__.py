"""One router per resource; `pronk.api.app` includes them."""
