#!/usr/bin/env bash
# bench/device.sh: the benchmark run on the GPU machine (the device tool's `run`).
#
# Builds nothing. Expects, carried with the working tree:
#   target/release/engine and the backend plugins beside it (target/release/libtandem_backend_*.so),
#   .gl/*.deb: the Vulkan loader and GL dispatch packages (see the device tool's README), unpacked
#              into / here so that the Vulkan backend finds the NVIDIA driver.
# Then, for every shape in SHAPES:
#   `engine synth` writes a random-weight GGUF of that shape for each dtype in DTYPES into $WORK,
#   `engine bench` runs it on every backend that `engine backends --json` lists as available,
#   bench/peer_torch.py runs transformers on the same shape in each mode of PEER_MODES;
# and last `engine bench --report $OUT/report` renders every JSON result. $OUT receives the
# report (report.md, tokens_per_s.svg, roofline.svg), the JSON results packed in one
# results.tar.gz (the tool brings back at most 8 files), and device.log.
#
# One device command may run 10 minutes: run a few shapes per call (SHAPES=gemma3-1b ...), keep
# RESULTS on a path that outlives the call only if the machine stays warm, or re-run --report
# here on the JSON files that came back.
#
# Parameters (environment):
#   SHAPES         shapes to run                        (gemma3-270m gemma3-1b)
#   DTYPES         tandem weight formats                (q4_k bf16)
#   BATCHES        batch sizes, comma-separated         (1,8,32)
#   PROMPT_TOKENS  prefill length                       (512)
#   GEN_TOKENS     tokens generated                     (128)
#   REPEAT         timed repeats                        (3)
#   BACKENDS       tandem backends to run               (every available one)
#   SKIP_BACKENDS  backends never run                   (faulty: the test suite's broken plugin)
#   CPU_SHAPES     shapes the cpu backend runs          (gemma3-270m gemma3-1b: larger ones take
#                                                        longer than a device command may run)
#   PEER_MODES     transformers modes                   (eager compile; empty: no peer)
#   PEER_SHAPES    shapes the peer runs                 ($SHAPES)
#   STEP_TIMEOUT   seconds one bench or peer run may take (540)
#   ENGINE         the engine binary                    (target/release/engine)
#   WORK           scratch for GGUF files               (/tmp/tandem-bench)
#   RESULTS        where JSON results gather            ($WORK/results)
#   OUT            what comes back                      (set by the device tool; ./bench-out otherwise)

set -uo pipefail

SHAPES=${SHAPES:-"gemma3-270m gemma3-1b"}
DTYPES=${DTYPES:-"q4_k bf16"}
BATCHES=${BATCHES:-"1,8,32"}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
GEN_TOKENS=${GEN_TOKENS:-128}
REPEAT=${REPEAT:-3}
BACKENDS=${BACKENDS:-}
SKIP_BACKENDS=${SKIP_BACKENDS:-faulty}
CPU_SHAPES=${CPU_SHAPES:-"gemma3-270m gemma3-1b"}
PEER_MODES=${PEER_MODES-"eager compile"}
PEER_SHAPES=${PEER_SHAPES:-$SHAPES}
STEP_TIMEOUT=${STEP_TIMEOUT:-540}
ENGINE=${ENGINE:-target/release/engine}
WORK=${WORK:-/tmp/tandem-bench}
RESULTS=${RESULTS:-$WORK/results}
OUT=${OUT:-$PWD/bench-out}

mkdir -p "$OUT" "$WORK" "$RESULTS"
export PYTHONUNBUFFERED=1

say() { printf '\n== %s\n' "$*"; }
contains() { case " $1 " in *" $2 "*) return 0 ;; *) return 1 ;; esac; }

main() {
failures=()

# --- the machine -------------------------------------------------------------------------------
say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
nproc

. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
if ! ldconfig -p | grep -q libvulkan; then
    echo "warning: no Vulkan loader (carry .gl/ with the loader debs); the vulkan backend will be unavailable"
fi

if [ ! -x "$ENGINE" ]; then
    chmod +x "$ENGINE" 2>/dev/null
fi
if [ ! -x "$ENGINE" ]; then
    echo "error: $ENGINE is missing: build it here with 'cargo build --release' and carry target/release"
    return 2
fi

# --- the backends ------------------------------------------------------------------------------
say "backends"
"$ENGINE" backends || true
if [ -z "$BACKENDS" ]; then
    BACKENDS=$("$ENGINE" backends --json | python3 -c '
import json, sys
doc = json.load(sys.stdin)
print(" ".join(b["name"] for b in doc.get("backends", []) if b.get("available")))
') || BACKENDS=""
fi
run_backends=()
for b in $BACKENDS; do
    contains "$SKIP_BACKENDS" "$b" || run_backends+=("$b")
done
echo "benchmarking backends: ${run_backends[*]:-(none)}"

# --- tandem ------------------------------------------------------------------------------------
for shape in $SHAPES; do
    for dtype in $DTYPES; do
        gguf="$WORK/$shape-$dtype.gguf"
        if [ ! -s "$gguf" ]; then
            say "synth $shape $dtype"
            if ! "$ENGINE" synth --shape "$shape" --dtype "$dtype" --out "$gguf"; then
                failures+=("synth $shape $dtype")
                rm -f "$gguf"
                continue
            fi
        fi
        for backend in "${run_backends[@]}"; do
            if [ "$backend" = cpu ] && ! contains "$CPU_SHAPES" "$shape"; then
                echo "skipping cpu for $shape (not in CPU_SHAPES)"
                continue
            fi
            say "tandem $backend $shape $dtype"
            json="$RESULTS/tandem-$backend-$shape-$dtype.json"
            if timeout "$STEP_TIMEOUT" "$ENGINE" bench --model "$gguf" --backend "$backend" \
                --prompt-tokens "$PROMPT_TOKENS" --gen-tokens "$GEN_TOKENS" --batch "$BATCHES" \
                --repeat "$REPEAT" --json >"$json.part"; then
                mv "$json.part" "$json"
            else
                failures+=("tandem $backend $shape $dtype (exit $?)")
                rm -f "$json.part"
            fi
        done
    done
    # Each shape's GGUF files can be tens of GB: keep the disk for the next shape.
    rm -f "$WORK/$shape"-*.gguf
done

# --- the peer ----------------------------------------------------------------------------------
for shape in $PEER_SHAPES; do
    for mode in $PEER_MODES; do
        say "transformers-$mode $shape"
        json="$RESULTS/transformers-$mode-$shape.json"
        if timeout "$STEP_TIMEOUT" python3 bench/peer_torch.py --shape "$shape" --batch "$BATCHES" \
            --prompt-tokens "$PROMPT_TOKENS" --gen-tokens "$GEN_TOKENS" --repeat "$REPEAT" \
            --mode "$mode" --out "$json.part"; then
            mv "$json.part" "$json"
        else
            failures+=("transformers-$mode $shape (exit $?)")
            rm -f "$json.part"
        fi
    done
done

# --- the report --------------------------------------------------------------------------------
say "report"
shopt -s nullglob
results=("$RESULTS"/*.json)
if [ ${#results[@]} -gt 0 ]; then
    "$ENGINE" bench --report "$OUT/report" "${results[@]}" || failures+=("report")
    tar -czf "$OUT/results.tar.gz" -C "$RESULTS" "${results[@]##*/}"
    [ -f "$OUT/report/report.md" ] && cat "$OUT/report/report.md"
else
    failures+=("no results")
fi

if [ ${#failures[@]} -gt 0 ]; then
    say "failed"
    printf '  %s\n' "${failures[@]}"
    return 1
fi
say "done: ${#results[@]} results"
}

main 2>&1 | tee -a "$OUT/device.log"
exit "${PIPESTATUS[0]}"
