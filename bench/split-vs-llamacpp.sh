#!/usr/bin/env bash
# bench/split-vs-llamacpp.sh: one layer-split cell of issue 55 beside llama.cpp, small enough
# for a short device call: SHAPE (gemma3-4b) q4_k, `engine bench --backend vulkan --gpu-layers
# NGL` beside `llama-bench -ngl NGL` (PROMPT prompt tokens, GEN generated), ROUNDS (2) rounds
# alternating the two (each engine warmed up once first), then, with PERF=1, one llama-bench
# prefill of the whole model with GGML_VK_PERF_LOGGER=1 (llama.cpp's per-op times, its last
# graph kept in $OUT/llama-perf.txt). bench/layers.sh is the full table.
# Here: `bash bench/package-device.sh .bench/new`, `../shared/peers/prepare-llamacpp-vulkan.sh
# .peer`. There (carrying .bench/new, .gl and .peer): `bash bench/split-vs-llamacpp.sh`.
set -uo pipefail
SHAPE=${SHAPE:-gemma3-4b}; NGL=${NGL:-17}; PROMPT=${PROMPT:-512}; GEN=${GEN:-64}; ROUNDS=${ROUNDS:-2}
E=${ENGINE:-.bench/new/engine}; PEER=${PEER:-.peer}; OUT=${OUT:-$PWD/bench-out}; WORK=${WORK:-/tmp}
mkdir -p "$OUT"; chmod +x "$E"; . "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh" >/dev/null 2>&1
TARGETS="llama-bench" OUTDIR=$OUT bash "$PEER/build-and-bench.sh" >"$OUT/build.log" 2>&1 || { echo "llama.cpp did not build"; tail -5 "$OUT/build.log"; exit 1; }
llama=(env LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu /tmp/lcpp/build/bin/llama-bench)
g=$WORK/$SHAPE-q4_k.gguf
[ -s "$g" ] || "$E" synth --shape "$SHAPE" --dtype q4_k --out "$g" --force >/dev/null || exit 1
"${llama[@]}" -m "$g" -p 64 -n 16 -fa 1 -ngl "$NGL" -r 1 >/dev/null 2>&1
timeout 120 "$E" bench --model "$g" --backend vulkan --gpu-layers "$NGL" --prompt-tokens 64 --gen-tokens 16 --repeat 1 >/dev/null 2>&1
# The table of the rounds run so far, and their JSON packed (a call cut short keeps both).
report() {
python3 - "$OUT" "$1" "$SHAPE" "$NGL" <<'PY' >"$OUT/report.md"
import json, sys
out, rounds, shape, ngl = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"| {shape} q4_k, N = {ngl} | round | prefill: ours / peer | decode: ours / peer |")
print("| --- | --- | --- | --- |")
for r in range(1, rounds + 1):
    try:
        t = json.load(open(f"{out}/tandem-{r}.json"))["runs"][0]
        tp, td = t["prefill_tokens_per_s"]["median"], t["decode_tokens_per_s"]["median"]
        lp = ld = None
        for x in json.load(open(f"{out}/llama-{r}.json")):
            if x["n_prompt"] > 0 and x["n_gen"] == 0: lp = x["avg_ts"]
            if x["n_gen"] > 0 and x["n_prompt"] == 0: ld = x["avg_ts"]
        print(f"| --gpu-layers {ngl} / -ngl {ngl} | {r} | {tp:,.1f} / {lp:,.1f} = {tp / lp:.2f} | {td:,.1f} / {ld:,.1f} = {td / ld:.2f} |")
    except Exception as e:
        print(f"| round {r} | failed: {e} | | |")
PY
tar -czf "$OUT/results.tar.gz" -C "$OUT" $(cd "$OUT" && ls *.json)
}
for r in $(seq "$ROUNDS"); do
    timeout 150 "${llama[@]}" -m "$g" -p "$PROMPT" -n "$GEN" -fa 1 -ngl "$NGL" -r 2 -o json >"$OUT/llama-$r.json" 2>/dev/null
    timeout 150 "$E" bench --model "$g" --backend vulkan --gpu-layers "$NGL" --prompt-tokens "$PROMPT" \
        --gen-tokens "$GEN" --repeat 2 --json >"$OUT/tandem-$r.json" 2>"$WORK/tandem-$r.err"
    report "$r"
done
cat "$OUT/report.md"
if [ "${PERF:-0}" = 1 ]; then
    GGML_VK_PERF_LOGGER=1 timeout 60 "${llama[@]}" -m "$g" -p 512 -n 0 -fa 1 -ngl 99 -r 1 2>"$OUT/llama-perf-all.txt" >/dev/null
    # The last graph's timings (the timed prompt step).
    awk '/^Vulkan Timings:/{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$OUT/llama-perf-all.txt" >"$OUT/llama-perf.txt"
    rm -f "$OUT/llama-perf-all.txt"
    echo "llama.cpp per-op, one 512-row prompt step:"; cat "$OUT/llama-perf.txt"
fi
rm -f "$OUT"/*.json "$OUT"/*.err
