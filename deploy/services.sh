#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer; start or install them if not.
# SeaweedFS (S3) is started by the test session itself, on free ports. nginx, the shared cache of the download
# tests (tests/proxy.py), is installed here where it is missing; the tests start their own on free ports.
set -euo pipefail

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

if ! port_open 5432; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq postgresql >/dev/null
  fi
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  conf="/etc/postgresql/$ver/main"
  # Tests connect over TCP as postgres without a password, as on the project machines.
  if ! grep -q "^host all all 127.0.0.1/32 trust" "$conf/pg_hba.conf"; then
    echo "host all all 127.0.0.1/32 trust" | $SUDO tee -a "$conf/pg_hba.conf" >/dev/null
  fi
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$ver" main start
fi
if ! port_open 6379; then
  command -v redis-server >/dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null; }
  $SUDO mkdir -p /var/lib/redis
  $SUDO redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis
fi
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nginx-light >/dev/null
  # The tests start their own nginx on free ports; the package's service (on port 80) is not wanted.
  if [ -d /run/systemd/system ]; then $SUDO systemctl disable --now nginx >/dev/null 2>&1 || true; fi
fi
for i in $(seq 1 30); do
  port_open 5432 && port_open 6379 && { echo "services: PostgreSQL and Redis are up"; exit 0; }
  sleep 1
done
echo "services: PostgreSQL or Redis did not come up" >&2
exit 1
