#!/usr/bin/env bash
# bench/speculative-vs-llamacpp.sh: speculative decoding by n-gram lookup, tandem's `engine
# serve --draft ngram` beside llama-server's `--spec-type` (each n-gram type it has), here on
# the CPU with the default model, one client for both (bench/spec_client.py) and copy-heavy
# prompts (bench/prompts/copy-passage-N.txt: a passage of the public-domain fixture text, then
# the start of its copy).
#
# Each server is started, warmed up by the client's first request (copy-passage-0), and
# measured by one streamed greedy request of MAX_TOKENS per other passage (1, 2, 3: distinct, so
# that no server gains from remembering an earlier reply): tokens over the time from each
# reply's first chunk to its last. Each engine's plain decode (tandem without --draft,
# llama-server with --spec-type none) in the same run gives its own speedup; each reply's text is
# kept, and summary.tsv says whether it is the engine's plain reply. $OUT gets each run's JSON
# and summary.tsv.
#
# Parameters: THREADS (2), MAX_TOKENS (256), ENGINE (target/release/engine),
# LLAMA_SERVER (/tmp/lcpp-cpu/bin/llama-server, built by ../shared/peers/build-cpu.sh),
# MODEL (the cached default model), TYPES (llama-server's types), DRAFT_TOKENS (tandem's
# --draft-tokens, 8), OUT.
set -uo pipefail
THREADS=${THREADS:-2}
N=${MAX_TOKENS:-256}
E=${ENGINE:-target/release/engine}
LS=${LLAMA_SERVER:-/tmp/lcpp-cpu/bin/llama-server}
MODEL=${MODEL:-$HOME/.cache/tandem/gemma-3-270m-q4_k_m.gguf}
TYPES=${TYPES:-"ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache"}
K=${DRAFT_TOKENS:-8}
PROMPTS=(bench/prompts/copy-passage-0.txt bench/prompts/copy-passage-1.txt bench/prompts/copy-passage-2.txt bench/prompts/copy-passage-3.txt)
OUT=${OUT:-$PWD/spec-out}
PORT=18473
mkdir -p "$OUT"
echo "THREADS=$THREADS MAX_TOKENS=$N DRAFT_TOKENS=$K bash bench/speculative-vs-llamacpp.sh" >"$OUT/command.txt"
printf 'engine\tsetting\tdecode_tok_s\tplain_text\n' >"$OUT/summary.tsv"

wait_up() {
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

measure() { # engine setting plain-setting
    local name="$1-$2"
    if wait_up; then
        python3 bench/spec_client.py "http://127.0.0.1:$PORT" "$N" "$name" "${PROMPTS[@]}" >"$OUT/$name.json"
        python3 - "$OUT/$name.json" "$OUT/$1-$3.json" "$1" "$2" >>"$OUT/summary.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
plain = json.load(open(sys.argv[2]))
same = [a["text"] == b["text"] for a, b in zip(d["runs"], plain["runs"])]
print(f"{sys.argv[3]}\t{sys.argv[4]}\t{d['decode_tokens_per_second']:.1f}\t{sum(same)}/{len(same)}")
PY
    else
        echo "$name did not start" >&2
    fi
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
}

cat >"$OUT/tandem.toml" <<TOML
[backend.cpu]
threads = $THREADS
TOML
for setting in plain ngram; do
    extra=()
    [ "$setting" = ngram ] && extra=(--draft ngram --draft-tokens "$K")
    "$E" serve --config "$OUT/tandem.toml" --backend cpu --model "$MODEL" --port $PORT --parallel 1 \
        "${extra[@]}" >"$OUT/tandem-$setting.log" 2>&1 &
    PID=$!
    measure tandem "$setting" plain
done
for t in none $TYPES; do
    "$LS" -m "$MODEL" -t "$THREADS" -c 4096 --port $PORT -np 1 --spec-type "$t" >"$OUT/llama-$t.log" 2>&1 &
    PID=$!
    measure llama-server "$t" none
done
"$E" --version >"$OUT/versions.txt" 2>&1
"$LS" --version >>"$OUT/versions.txt" 2>&1
cat "$OUT/summary.tsv"
