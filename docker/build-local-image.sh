#!/usr/bin/env bash
# Build (or reuse) farm's runtime image from this machine's Python, without a registry or base image.
#   docker/build-local-image.sh                      # -> farm-runtime:local
#   docker/build-local-image.sh --tag farm-runtime:ci --force
# Needs: a running dockerd, and the project's Python dependencies installed on the host.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m workers.images "$@"
