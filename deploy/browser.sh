#!/usr/bin/env bash
# Make sure a Chromium the dashboard's browser tests can drive is installed at /usr/bin/chromium (Debian's
# package; Playwright's own browser download is not reachable from every machine). Idempotent: does nothing
# when it is already there.
set -euo pipefail

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

if [ ! -x "$CHROMIUM" ]; then
  # The package lists may be stale or empty on a fresh machine: install, and update the lists only if that fails.
  $SUDO apt-get install -y -qq chromium >/dev/null 2>&1 || {
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
  }
fi
"$CHROMIUM" --version >/dev/null 2>&1 || { echo "browser: $CHROMIUM does not run" >&2; exit 1; }
echo "browser: $("$CHROMIUM" --version 2>/dev/null)"
