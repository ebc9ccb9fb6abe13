#!/usr/bin/env bash
# Makes sure the web page's test has a real headless browser: chromium and chromedriver on PATH,
# else Debian's packages where they can be installed. Where they cannot, that one test skips and
# says why.
set -euo pipefail

command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && exit 0
"$(dirname "$0")/apt-install.sh" chromium chromium-driver && exit 0
echo "no chromium and chromedriver, and Debian's packages cannot be installed here:" \
     "the web page's test will skip."
