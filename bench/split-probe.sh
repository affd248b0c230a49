#!/usr/bin/env bash
# bench/split-probe.sh: where a layer split's decode step goes (issue 55's split decode cells),
# tandem only, on the GPU machine. For SHAPE (gemma3-4b) q4_k split by `--gpu-layers NGL` (17):
#   1. for each VARIANT of VARIANTS (`name` or `name:VAR=VAL,...`, environment for that run;
#      default "base"): `engine bench --backend vulkan --gpu-layers NGL --prompt-tokens 128
#      --gen-tokens GEN --repeat 2`, with the GPU's clocks sampled every 50 ms by nvidia-smi (a
#      query: nothing is set), printing the decode median, each unit's host time a decode step
#      (`split_host_ms`: in execute, waiting, copying) and the SM clocks seen;
#   2. once, the split with `--profile` (each unit's ops, `unit: op`), and the whole model on
#      `--backend vulkan` and on `--backend cpu` with `--profile`: the same ops' decode times
#      when one unit runs the step.
# JSON and clock samples under $OUT. Here: `bash bench/package-device.sh .bench/new`. There
# (carrying .bench/new and .gl): `bash bench/split-probe.sh`.
set -uo pipefail
SHAPE=${SHAPE:-gemma3-4b}; NGL=${NGL:-17}; GEN=${GEN:-64}
OUT=${OUT:-$PWD/bench-out}; E=${ENGINE:-.bench/new/engine}
mkdir -p "$OUT"; chmod +x "$E"; . "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh" >/dev/null 2>&1
g=${WORK:-/tmp}/$SHAPE-q4_k.gguf
[ -s "$g" ] || "$E" synth --shape "$SHAPE" --dtype q4_k --out "$g" --force >/dev/null || exit 1
split=(--backend vulkan --gpu-layers "$NGL")
summary() { # JSON file, label
    python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))["runs"][0]
except Exception as e:
    print(sys.argv[2], "failed", e); sys.exit()
line = f"{sys.argv[2]}: decode {r['decode_tokens_per_s']['median']:.1f} tok/s"
for u in r.get("split_host_ms") or []:
    line += f" | {u['unit']} execute {u['execute']:.2f} wait {u['wait']:.2f} copy {u['copy']:.2f} ms"
print(line)
for o in (r.get("profile") or {}).get("decode", [])[:14]:
    print(f"    {o['op']:<34} {o['nodes']:>4} nodes {o['seconds'] * 1e3:8.3f} ms")
PY
}
for v in ${VARIANTS:-base}; do
    name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate --format=csv,noheader -lms 50 >"$OUT/clocks-$name.txt" 2>/dev/null &
    smi=$!
    env "${envs[@]}" timeout 150 "$E" bench --model "$g" "${split[@]}" --prompt-tokens 128 --gen-tokens "$GEN" \
        --repeat 2 --json >"$OUT/split-$name.json" 2>"$OUT/split-$name.err"
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
    summary "$OUT/split-$name.json" "split $name"
    echo "    SM clocks (MHz) seen: $(cut -d, -f1 "$OUT/clocks-$name.txt" | sort | uniq -c | sort -rn | head -5 | tr -s ' ' | tr '\n' ';')"
done
timeout 150 "$E" bench --model "$g" "${split[@]}" --prompt-tokens 128 --gen-tokens 16 --profile --json \
    >"$OUT/split-profile.json" 2>"$OUT/split-profile.err"
summary "$OUT/split-profile.json" "split, profiled"
for b in vulkan cpu; do
    timeout 150 "$E" bench --model "$g" --backend "$b" --prompt-tokens 128 --gen-tokens 16 --profile --json \
        >"$OUT/$b-profile.json" 2>"$OUT/$b-profile.err"
    summary "$OUT/$b-profile.json" "$b alone, profiled"
done
