#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for vessel-workers: the system packages the
# sandbox and the tests need, then a virtualenv in .venv with the project in it.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# What this makes (.venv) must be readable by the unprivileged test user of
# scripts/test-unprivileged, whatever the caller's umask.
umask 022

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-sentinel >/dev/null || need_apt+=(redis-sentinel)  # the Sentinel failover test
command -v openssl >/dev/null || need_apt+=(openssl)  # the TLS Redis tests' certificates
[ -e /usr/lib/x86_64-linux-gnu/libseccomp.so.2 ] || [ -e /lib/x86_64-linux-gnu/libseccomp.so.2 ] \
  || ldconfig -p 2>/dev/null | grep -q libseccomp.so.2 || need_apt+=(libseccomp2)
python3 -c "import venv, ensurepip" 2>/dev/null || need_apt+=(python3-venv)
# The static Landlock prefix every sandbox call starts with is compiled here (below).
command -v cc >/dev/null || command -v gcc >/dev/null || need_apt+=(gcc)
# The Flower test renders its Tasks page in headless Chromium.
command -v chromium >/dev/null || need_apt+=(chromium)

if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${need_apt[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,dev,bench]'
# The static Landlock prefix (workers/sandbox/command_prefix.py): without it every
# sandbox call starts Perl instead, ~1.6 ms more. Rebuilt every time (it is ~50 ms).
.venv/bin/python -m workers.sandbox.command_prefix >/dev/null
echo "setup: ready (.venv/bin/vessel-workers)" >&2
