#!/usr/bin/env bash
# bench/split-probe.sh: where a layer split's decode step goes (issue 55's split decode cells),
# tandem only, on the GPU machine. For SHAPE (gemma3-4b) q4_k split by `--gpu-layers NGL` (17):
#   1. `engine bench --backend vulkan --gpu-layers NGL --prompt-tokens PROMPT (128) --gen-tokens GEN
#      --repeat 2`, with the GPU's clocks sampled every 50 ms by nvidia-smi and the process's
#      threads by `top -H` during decode (queries: nothing is set): the decode median, each
#      unit's host time a decode step (`split_host_ms`: in execute, waiting, copying), the SM
#      clocks seen and the busiest threads;
#   2. for each VARIANT of VARIANTS (`name` or `name:VAR=VAL,...`, environment for that run;
#      default "base"), the split as in 1 without the samples, ROUNDS (1) rounds alternating
#      the variants; then each with `--profile`: each unit's ops (`unit: op`), µs a node;
#   3. with `--profile`: the whole model on `--backend cpu`; the same pinned by `taskset` to
#      TASKSET_CPUS (default 1-15: one core fewer than the pool's threads); and every layer on
#      the CPU with the head alone on vulkan (`[placement.layers]`, `--backend auto`): the CPU's
#      ops with and without a GPU unit beside them. EXTRA=0 stops after step 2's rounds.
# JSON and samples under $OUT. Here: `bash bench/package-device.sh .bench/new`. There (carrying
# .bench/new and .gl): `bash bench/split-probe.sh`.
set -uo pipefail
SHAPE=${SHAPE:-gemma3-4b}; NGL=${NGL:-17}; GEN=${GEN:-64}; LAYERS=${LAYERS:-34}; PROMPT=${PROMPT:-128}
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
for o in (r.get("profile") or {}).get("decode", [])[:12]:
    print(f"    {o['op']:<40} {o['nodes']:>4} nodes {o['seconds'] * 1e3:8.3f} ms {o['seconds'] * 1e6 / o['nodes']:8.1f} us/node")
PY
}
nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate --format=csv,noheader -lms 50 >"$OUT/clocks.txt" 2>/dev/null &
smi=$!
timeout 150 "$E" bench --model "$g" "${split[@]}" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" \
    --repeat 2 --json >"$OUT/split.json" 2>"$OUT/split.err" &
pid=$!
sleep "${TOP_AT:-12}"
# (`$pid` is timeout's; the engine is its child.)
top -b -H -n 1 -d 1 -p "$(pgrep -P "$pid" | head -1)" >"$OUT/top.txt" 2>&1
wait "$pid"
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
summary "$OUT/split.json" "split"
echo "    SM clocks (MHz) seen: $(cut -d, -f1 "$OUT/clocks.txt" | sort | uniq -c | sort -rn | head -5 | tr -s ' ' | tr '\n' ';')"
echo "    threads (top -H, at ${TOP_AT:-12} s):"; grep -A12 "PID USER" "$OUT/top.txt" | sed 's/^/      /'
profiled() { # label, then the command's arguments
    local label=$1; shift
    timeout 150 "$@" --prompt-tokens "$PROMPT" --gen-tokens 16 --profile --json >"$OUT/$label.json" 2>"$OUT/$label.err"
    summary "$OUT/$label.json" "$label"
}
# Each variant unprofiled (decode and host times), ROUNDS times alternating, then profiled.
for r in $(seq "${ROUNDS:-1}"); do
    for v in ${VARIANTS:-base}; do
        name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
        timeout 150 env "${envs[@]}" "$E" bench --model "$g" "${split[@]}" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" \
            --repeat 2 --json >"$OUT/split-$name-$r.json" 2>"$OUT/split-$name-$r.err"
        summary "$OUT/split-$name-$r.json" "split $name, round $r"
    done
done
[ "${EXTRA:-1}" = 1 ] || exit 0
for v in ${VARIANTS:-base}; do
    name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
    profiled "split-$name" env "${envs[@]}" "$E" bench --model "$g" "${split[@]}"
done
profiled cpu "$E" bench --model "$g" --backend cpu
profiled cpu-taskset taskset -c "${TASKSET_CPUS:-1-15}" env TANDEM_CPU_THREADS="${POOL_THREADS:-16}" "$E" bench --model "$g" --backend cpu
printf '[placement.layers]\ncpu = "0-%s"\nembedding = "cpu"\nhead = "vulkan"\n' "$((LAYERS - 1))" >"$OUT/head.toml"
profiled cpu-layers-gpu-head "$E" --config "$OUT/head.toml" bench --model "$g" --backend auto
