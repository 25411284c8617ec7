#!/usr/bin/env bash
# Installs what building and testing evmesh need on a fresh Debian machine (RocksDB's bindings
# need libclang; the TLS interop test drives the openssl command line).
# Idempotent and quiet when everything is already there.
set -euo pipefail
need=()
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
