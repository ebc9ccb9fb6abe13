#!/usr/bin/env bash
# Installs Debian packages where this machine allows it (apt-get, and root or sudo without a
# password); exits 1 where it does not, so the caller can fall back.
# Usage: scripts/apt-install.sh PACKAGE...
set -euo pipefail

command -v apt-get >/dev/null 2>&1 || exit 1
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo -n"; fi
$sudo true 2>/dev/null || exit 1
echo "installing Debian's $* ..."
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -qq "$@" >/dev/null 2>&1 \
  || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@" >/dev/null; }
