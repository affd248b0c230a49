#!/usr/bin/env bash
# Installs what tandem needs to build and test on Debian (bookworm): a C toolchain for crates
# that build C, and the Rust components used by the test command. Idempotent and quiet when
# everything is present.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
# The Vulkan backend at run time: the loader, lavapipe (Mesa's CPU driver, which the tests run
# on) and the Khronos validation layer the tests turn on.
if command -v dpkg >/dev/null 2>&1; then
  for p in libvulkan1 mesa-vulkan-drivers vulkan-validationlayers; do
    dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
  done
fi
# The openai client test (scripts/test-openai.sh) makes a virtualenv: Debian's python3 needs
# python3-venv for that.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need_apt+=(python3 python3-venv)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (rustup, or Debian's cargo >= 1.87) and run again" >&2
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
