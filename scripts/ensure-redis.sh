#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are on PATH (the tests start their own servers with them).
# Uses the ones on PATH; else installs Debian's packages; else says how to get them.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "installing Debian's redis-server and redis-tools ..."
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
fi
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server and redis-cli are needed on PATH: install them (Debian/Ubuntu:" \
       "apt-get install redis-server redis-tools; macOS: brew install redis) and rerun." >&2
  exit 1
fi
