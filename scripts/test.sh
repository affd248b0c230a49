#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test of the workspace (unit tests, the
# backend conformance suite through the plugin loader, end-to-end CLI tests, engine serve through
# the openai Python client).
# Installs what it needs first (see scripts/setup.sh), so it runs on a fresh Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
# The real default model: the end-to-end tests compare it with transformers.
./scripts/fetch-model.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
echo "== engine serve through the openai Python client"
./scripts/test-openai.sh
