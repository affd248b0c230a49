#!/usr/bin/env bash
# engine serve through the official `openai` Python client (PyPI), on the default model.
# The virtualenv is made once and kept in the cache directory (keyed by the pinned version);
# needs python3 with venv (scripts/setup.sh installs python3-venv on Debian) and the model
# (scripts/fetch-model.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

OPENAI_VERSION=3.51.0
cache="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}"
venv="$cache/openai-venv-$OPENAI_VERSION"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi

cargo build --locked --quiet -p tandem-cli -p tandem-backend-cpu
"$venv/bin/python" cli/tests/openai/client_test.py target/debug/engine target/debug \
  "$cache/gemma-3-270m-q4_k_m.gguf"
