#!/usr/bin/env bash
# Make Debian's chromium available for the page's browser test (tests/test_page_browser.py), like
# kube-build.sh makes etcd and the kube binaries: idempotent, and never fatal. Only the distribution's
# package (apt), never a browser download from elsewhere; where apt cannot be used (not root, no
# network, not Debian) the test skips and says why.
set -uo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "scripts/chromium.sh: chromium missing and apt-get not usable here (not root or not Debian): the browser test will skip" >&2
  exit 0
fi
echo "scripts/chromium.sh: installing Debian's chromium for the page's browser test" >&2
log=$(mktemp)
if ! { apt-get update >"$log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >>"$log" 2>&1; }; then
  tail -5 "$log" >&2
  echo "scripts/chromium.sh: could not install chromium: the browser test will skip" >&2
fi
rm -f "$log"
exit 0
