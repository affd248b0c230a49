#!/usr/bin/env bash
# bench/vs-llama-server.sh: `engine serve` beside llama-server under the same load (issue 32), in
# one device run, on the same `engine synth` files, with the same load client (`engine loadgen`:
# streamed /v1/completions, greedy, its default prompt).
#
# Here, first: `../shared/peers/prepare-llamacpp-vulkan.sh .peer` (the llama.cpp kit), a release
# build stripped into .devcarry/ (engine, libtandem_backend_vulkan.so, libtandem_backend_cpu.so)
# and the Vulkan loader debs in .gl/ (see bench/device.sh). There (the device tool's `run`,
# carrying .peer .devcarry .gl):
#   SHAPES="gemma3-1b gemma3-4b" bash bench/vs-llama-server.sh
# Per shape: `engine serve --backend vulkan --parallel P --context C`, then
# `llama-server -ngl 99 -fa on -np P -c P*C` (its context is shared by its slots), each warmed up
# with one untimed load run (8 clients, 16 requests), then `engine loadgen --clients CLIENTS
# --requests R --max-tokens G --json` against it. $OUT gets each server's loadgen JSON, their
# logs' tails, summary.tsv (shape, server, clients, tok/s, TTFT p50/p99 ms, ITL p50/p99 ms) and
# serve.log.
#
# Parameters (environment): SHAPES ("gemma3-1b gemma3-4b"), DTYPE (q4_k), CLIENTS ("1,8,32,64"),
# REQUESTS (64 per level), GEN_TOKENS (64), PROMPT (loadgen's default prompt), DISTINCT (set:
# `--distinct-prompts`, every request's prompt starts with its number, so neither server reuses
# one request's prompt for another), PARALLEL (64 slots for both), CONTEXT (1024 tokens a
# slot), BACKEND (tandem's, vulkan), TANDEM_ARGS (extra `engine serve` flags), SKIP_PEER (set: tandem only), PEER (.peer),
# OUT.
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-1b gemma3-4b"}
DTYPE=${DTYPE:-q4_k}
CLIENTS=${CLIENTS:-1,8,32,64}
REQUESTS=${REQUESTS:-64}
G=${GEN_TOKENS:-64}
P=${PARALLEL:-64}
C=${CONTEXT:-1024}
TANDEM_ARGS=${TANDEM_ARGS:-}
PROMPT_ARGS=()
[ -n "${PROMPT:-}" ] && PROMPT_ARGS+=(--prompt "$PROMPT")
[ -n "${DISTINCT:-}" ] && PROMPT_ARGS+=(--distinct-prompts)
PEER=${PEER:-.peer}
OUT=${OUT:-$PWD/serve-out}
W=/tmp/tandem-serve
E=.devcarry/engine
mkdir -p "$OUT" "$W"
{
echo "SHAPES=\"$SHAPES\" CLIENTS=$CLIENTS REQUESTS=$REQUESTS GEN_TOKENS=$G PARALLEL=$P CONTEXT=$C TANDEM_ARGS=\"$TANDEM_ARGS\" PROMPT=\"${PROMPT:-}\" DISTINCT=${DISTINCT:-} bash bench/vs-llama-server.sh"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
SERVER=/tmp/lcpp/build/bin/llama-server
if [ -z "${SKIP_PEER:-}" ] && [ ! -x "$SERVER" ]; then
    # (llama-bench too: the kit checks the device with it.)
    OUTDIR=$W/peer TARGETS="llama-bench llama-server" MODELS="" bash "$PEER/build-and-bench.sh" >"$W/peer-build.log" 2>&1 ||
        { tail -20 "$W/peer-build.log"; echo "llama-server did not build"; }
    grep -h "built in" "$W/peer-build.log"
fi
[ -d /tmp/vk/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# Waits until the server on port $1 answers /health with 200 (at most 300 s).
ready() {
    for _ in $(seq 600); do
        python3 -c "import sys, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/health', timeout=2)" "$1" \
            >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}
# Warms the server on port $1 up, then loads it; JSON into $2.
load() {
    "$E" loadgen --url "http://127.0.0.1:$1" --clients 8 --requests 16 --max-tokens "$G" "${PROMPT_ARGS[@]}" --json >/dev/null 2>&1
    "$E" loadgen --url "http://127.0.0.1:$1" --clients "$CLIENTS" --requests "$REQUESTS" --max-tokens "$G" "${PROMPT_ARGS[@]}" \
        --duration 120 --json >"$2" 2>"$W/loadgen.err" || { echo "   loadgen failed"; tail -3 "$W/loadgen.err"; }
}
printf 'shape\tserver\tclients\ttok_s\tttft_p50_ms\tttft_p99_ms\titl_p50_ms\titl_p99_ms\n' >"$OUT/summary.tsv"
for shape in $SHAPES; do
    g=$W/$shape-$DTYPE.gguf
    [ -s "$g" ] || "$E" synth --shape "$shape" --dtype "$DTYPE" --out "$g" >/dev/null || { echo "synth $shape failed"; continue; }
    echo "== $shape: engine serve --backend ${BACKEND:-vulkan} --parallel $P --context $C $TANDEM_ARGS"
    "$E" serve --model "$g" --backend "${BACKEND:-vulkan}" --parallel "$P" --context "$C" --queue 256 --port 8090 $TANDEM_ARGS \
        >"$W/tandem.log" 2>&1 &
    pid=$!
    t0=$(date +%s.%N)
    if ready 8090; then
        echo "   listening after $(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0") s (load and warm-up)"
        load 8090 "$OUT/$shape-tandem.json"; else echo "   engine serve did not start"; fi
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8090/metrics', timeout=5).read().decode())" \
        2>/dev/null | grep -E "^tandem_(prompt|requests|step)" >"$OUT/$shape-tandem-metrics.txt"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    tail -5 "$W/tandem.log" >"$OUT/$shape-tandem.log"
    if [ -z "${SKIP_PEER:-}" ]; then
        echo "== $shape: llama-server -ngl 99 -fa on -np $P -c $((P * C))"
        "$SERVER" -m "$g" -ngl 99 -fa on -np "$P" -c $((P * C)) --port 8091 >"$W/llama.log" 2>&1 &
        pid=$!
        t0=$(date +%s.%N)
        if ready 8091; then
            echo "   listening after $(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0") s"
            load 8091 "$OUT/$shape-llama-server.json"; else echo "   llama-server did not start"; fi
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
        tail -5 "$W/llama.log" >"$OUT/$shape-llama-server.log"
    fi
    for server in tandem llama-server; do
        python3 - "$OUT/$shape-$server.json" "$shape" "$server" >>"$OUT/summary.tsv" <<'PY'
import json, sys
try:
    levels = json.load(open(sys.argv[1]))["levels"]
except Exception:
    sys.exit(0)
for l in levels:
    print(f"{sys.argv[2]}\t{sys.argv[3]}\t{l['clients']}\t{l['tokens_per_second']:.1f}\t"
          f"{l['ttft_ms']['p50']:.1f}\t{l['ttft_ms']['p99']:.1f}\t{l['itl_ms']['p50']:.1f}\t{l['itl_ms']['p99']:.1f}")
PY
    done
    grep "^$shape" "$OUT/summary.tsv"
done
} 2>&1 | tee "$OUT/serve.log"
