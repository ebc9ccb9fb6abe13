#!/usr/bin/env bash
# Makes sure the web page's test has a real headless browser: chromium and chromedriver on PATH,
# else Debian's packages where they can be installed (root, or sudo without a password).
# Where they cannot, that one test skips and says why.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo -n"; fi
  if $sudo true 2>/dev/null; then
    echo "installing Debian's chromium and chromium-driver (the web page's test) ..."
    if DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver \
        >/dev/null 2>&1 \
      || { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           $sudo apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
      exit 0
    fi
  fi
fi
echo "no chromium and chromedriver, and Debian's packages cannot be installed here:" \
     "the web page's test will skip."
