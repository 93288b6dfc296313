#!/usr/bin/env bash
# Make sure wrk (a C HTTP load generator, Debian's package) is installed for bench/tail.py. Idempotent: does
# nothing when it is already there.
set -euo pipefail

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

if ! command -v wrk >/dev/null; then
  # The package lists may be stale or empty on a fresh machine: install, and update the lists only if that fails.
  $SUDO apt-get install -y -qq wrk >/dev/null 2>&1 || {
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq wrk >/dev/null
  }
fi
command -v wrk >/dev/null || { echo "wrk: not installed" >&2; exit 1; }
