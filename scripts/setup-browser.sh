#!/usr/bin/env bash
# The UI test drives Debian's Chromium (/usr/bin/chromium) headless through Playwright; install it if missing.
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The UI test needs Chromium at /usr/bin/chromium: install Debian's package (apt-get install chromium)." >&2
  exit 1
fi
echo "Installing Debian's chromium for the UI test"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }
