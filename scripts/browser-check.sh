#!/usr/bin/env bash
# Opens spate's dashboard in a real browser and checks it as a person would (see dashboard-check.mjs):
# Debian's chromium, and playwright-core from npm to drive it, are installed on first use (chromium
# with apt-get, so as root, as in CI; playwright-core into a cache directory, never into the repo).
# Usage: scripts/browser-check.sh BASE_URL SCREENSHOT_PNG [APP...]
#   APP: the apps under load, whose throughput must show on the page.
set -euo pipefail
PLAYWRIGHT_CORE_VERSION=1.64.1
cache=${XDG_CACHE_HOME:-$HOME/.cache}/spate
mkdir -p "$cache"
# Tests run side by side, and apt-get and npm refuse (or break) a second install at once: one installs
# while the others wait, then finds everything there.
exec 9>"$cache/browser-install.lock"
flock 9
if [[ ! -x /usr/bin/chromium ]]; then
	if [[ $(id -u) != 0 ]]; then
		echo "browser-check.sh: Debian's chromium is missing, and installing it needs root (CI runs as root)" >&2
		exit 2
	fi
	echo "browser-check.sh: installing Debian's chromium" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
modules=${SPATE_PLAYWRIGHT_DIR:-$cache/playwright-core-$PLAYWRIGHT_CORE_VERSION}
if [[ ! -f $modules/node_modules/playwright-core/package.json ]]; then
	echo "browser-check.sh: installing playwright-core $PLAYWRIGHT_CORE_VERSION into $modules" >&2
	mkdir -p "$modules"
	npm install --silent --no-audit --no-fund --prefix "$modules" "playwright-core@$PLAYWRIGHT_CORE_VERSION" >&2
fi
exec 9>&-
SPATE_PLAYWRIGHT_DIR=$modules exec node "$(dirname "$0")/dashboard-check.mjs" "$@"
