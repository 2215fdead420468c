#!/usr/bin/env bash
# The test suite, including the real-browser dashboard test (needs Debian's chromium).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: chromium is not installed; the browser test will fail (apt-get install chromium)" >&2
  fi
fi
python -m pytest "$@"
