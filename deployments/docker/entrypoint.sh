#!/bin/sh
# The entrypoint of pronk's images: the pronk CLI, unless the first argument is a program the image has.
#   docker run pronk:cpu worker start --job smollm2-cpu ...         runs  pronk worker start --job smollm2-cpu ...
#   docker run pronk:cpu prefect worker start --pool pronk ...      runs  prefect worker start --pool pronk ...
# Prefect's Kubernetes worker needs the second form: it passes a flow run's command (`prefect flow-run execute`) as
# the container's arguments, after the image's entrypoint. No pronk command is named like a program on PATH
# (tests/deployments/test_images.py checks).
set -e
case "${1:-}" in
    "" | -*) ;;
    *) if command -v "$1" > /dev/null 2>&1; then exec "$@"; fi ;;
esac
exec pronk "$@"
