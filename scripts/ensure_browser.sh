#!/usr/bin/env bash
# Install Debian's Chromium and its WebDriver (/usr/bin/chromium, /usr/bin/chromedriver)
# for the browser tests (tests/e2e/test_browser_ui.py), from the distribution's package
# registry: nothing ever downloads a browser of its own. Idempotent: returns at once when
# both are there. Needs root (or passwordless sudo) and a reachable apt mirror.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "ensure_browser: /usr/bin/chromium or /usr/bin/chromedriver missing and not root:" \
       "install the chromium and chromium-driver packages" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq chromium chromium-driver >/dev/null
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  echo "ensure_browser: apt-get installed chromium but /usr/bin/chromium or /usr/bin/chromedriver is missing" >&2
  exit 1
fi
