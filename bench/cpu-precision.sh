#!/usr/bin/env bash
# bench/cpu-precision.sh: the CPU backend's `precision = "fast"` against `"exact"` on the real
# default model, here: `engine bench` decode and prefill (alternating, REPEAT rounds) and the
# precision rule's check by `engine perplexity --kl-divergence` over the shipped text
# (tests/fixtures/text, every chunk, steps of 4 rows so the decode-shaped products score every
# token). Writes JSON and the perplexity reports into OUT (default bench/results/<date>-cpu-int8).
# Usage: ENGINE=/work/reltarget/release/engine bash bench/cpu-precision.sh
set -euo pipefail
E=${ENGINE:-target/release/engine}
OUT=${OUT:-bench/results/$(date +%F)-cpu-int8}
ROUNDS=${ROUNDS:-2}
TEXT=tests/fixtures/text/around-the-world-in-80-days-1-5.txt
mkdir -p "$OUT"
tmp=$(mktemp -d)
for p in exact fast; do printf '[backend.cpu]\nprecision = "%s"\n' "$p" > "$tmp/$p.toml"; done
for r in $(seq 1 "$ROUNDS"); do
  for p in exact fast; do
    "$E" --config "$tmp/$p.toml" bench --backend cpu --prompt-tokens 64 --gen-tokens 128 --repeat 3 \
      --json > "$OUT/bench-$p-$r.json" 2>/dev/null
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(sys.argv[2], 'decode %.1f prefill %.1f tok/s' % (r['decode_tokens_per_s']['median'], r['prefill_tokens_per_s']['median']))" "$OUT/bench-$p-$r.json" "$p round $r"
  done
done
"$E" --config "$tmp/exact.toml" perplexity --backend cpu --file "$TEXT" --chunk 4 \
  --kl-divergence-base "$tmp/exact.kl" > "$OUT/perplexity-exact.txt" 2>&1
"$E" --config "$tmp/fast.toml" perplexity --backend cpu --file "$TEXT" --chunk 4 \
  --kl-divergence "$tmp/exact.kl" > "$OUT/perplexity-fast-vs-exact.txt" 2>&1
"$E" --config "$tmp/fast.toml" perplexity --backend cpu --file "$TEXT" --chunk 4 \
  --kl-divergence "$tmp/exact.kl" --json > "$OUT/kl-fast-vs-exact.json" 2>/dev/null
tail -12 "$OUT/perplexity-fast-vs-exact.txt"
rm -rf "$tmp"
