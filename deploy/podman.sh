#!/usr/bin/env bash
# Make this machine able to build and run the farm's containers with podman, where no image registry is
# reachable. Idempotent: installs only what is missing, rewrites nothing that is already right.
#
#   1. podman, runc and debootstrap from Debian's packages;
#   2. /etc/containers/containers.conf: no default ulimits (setting rlimits is not permitted in some
#      sandboxes) and runc as the runtime (crun fails where cgroups are in hybrid mode);
#   3. a local base image, $ENGINEFARM_LOCAL_BASE (default localhost/enginefarm-base:bookworm): Debian bookworm
#      from debootstrap with python3, python3-venv and ca-certificates, so deploy/Containerfile builds FROM it
#      exactly as it builds FROM python:3.12-slim. This machine's CA bundle goes into the image and PIP_CERT
#      names it, so pip inside builds trusts what this machine trusts (a TLS-inspecting proxy's CA included).
#
# Prints the base image's name on its last line.
set -euo pipefail

BASE_IMAGE="${ENGINEFARM_LOCAL_BASE:-localhost/enginefarm-base:bookworm}"
SUITE="${ENGINEFARM_LOCAL_SUITE:-bookworm}"
MIRROR="${ENGINEFARM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CONF=/etc/containers/containers.conf
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

missing=()
for tool in podman:podman runc:runc debootstrap:debootstrap; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# containers.conf is TOML: keep whatever else is there, add each key under its table if it is absent.
$SUDO mkdir -p /etc/containers
$SUDO touch "$CONF"
ensure_key() {  # table key value
  local table="$1" key="$2" value="$3"
  if ! $SUDO grep -Eq "^\s*$key\s*=" "$CONF"; then
    if $SUDO grep -q "^\[$table\]" "$CONF"; then
      $SUDO sed -i "/^\[$table\]/a $key = $value" "$CONF"
    else
      printf '\n[%s]\n%s = %s\n' "$table" "$key" "$value" | $SUDO tee -a "$CONF" >/dev/null
    fi
  fi
}
ensure_key containers default_ulimits "[]"
ensure_key engine runtime '"runc"'

if ! $SUDO podman image exists "$BASE_IMAGE"; then
  root=$(mktemp -d /var/tmp/enginefarm-base.XXXXXX)
  trap '$SUDO rm -rf "$root"' EXIT
  $SUDO debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >/dev/null
  $SUDO chroot "$root" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends python3 python3-venv ca-certificates >/dev/null && apt-get clean && \
      rm -rf /var/lib/apt/lists/*"
  $SUDO cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  $SUDO tar -C "$root" -c . | $SUDO podman import --quiet \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
fi
echo "$BASE_IMAGE"
