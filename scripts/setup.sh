#!/usr/bin/env bash
# Installs what tandem needs to build and test on Debian (bookworm): a C toolchain for crates
# that build C, and the Rust components used by the test command. Checks first that Rust is
# at least Cargo.toml's `rust-version` and, where it is missing or older, says how to get it.
# Idempotent and quiet when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# First, the Rust toolchain: the one minimum is the workspace's `rust-version` in Cargo.toml.
# Debian's own cargo (1.63 in bookworm) is far older; rustup installs a current one.
min_rust=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' Cargo.toml | head -n1)
rustup_install="curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y && . \"\$HOME/.cargo/env\""
version_of() { "$1" --version 2>/dev/null | sed -n 's/^[a-z]* \([0-9][0-9.]*\).*/\1/p'; }
older_than() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" != "$2" ]; }
if ! command -v cargo >/dev/null 2>&1 || ! command -v rustc >/dev/null 2>&1; then
  echo "error: tandem needs Rust $min_rust or newer, and cargo is not installed. Install it with rustup:" >&2
  echo "  $rustup_install" >&2
  echo "then run this script again." >&2
  exit 1
fi
have_rust=$(version_of rustc)
if [ -z "$have_rust" ] || older_than "$have_rust" "$min_rust"; then
  echo "error: tandem needs Rust $min_rust or newer; this rustc is ${have_rust:-of unknown version} ($(command -v rustc))." >&2
  if command -v rustup >/dev/null 2>&1; then
    echo "  update it with: rustup update stable && rustup default stable" >&2
  else
    echo "  Debian's rustc/cargo packages are too old: install rustup's instead:" >&2
    echo "  $rustup_install" >&2
  fi
  echo "then run this script again." >&2
  exit 1
fi

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

if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
