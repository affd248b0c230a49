#!/usr/bin/env bash
# bench/khr-experiments.sh: checks and measures the KHR-path experiments of issue 54 in one device
# call, against the default kernels of the same build.
#
# Here, first: `bench/package-device.sh $BIN` (a release build stripped into $BIN, the release
# test binaries `vulkan_backend` and `conformance` into $BIN/t/deps with the plugins in $BIN/t,
# where the tests find them), and the Vulkan loader debs in .gl/ (bench/device.sh says how). There (the device tool's `run`, carrying $BIN and .gl):
#   BIN=.bench/new bash bench/khr-experiments.sh
# 1. Correctness, KHR path (coopmat2 off), validation off (the layer is not on that machine):
#    `vulkan_backend prefill` (every weight format and variant at odd sizes, `matmul_khr` and
#    `matmul_coopmat`), then the conformance binary at the tensor-core floor (`attention_coopmat`,
#    the default on this path, in the prefill attention cases).
# 2. Speed: `engine bench` prefill 512 / decode on each SHAPES entry with each setting of CONFIGS
#    (label=ENV,ENV... ; `-` for none) on the KHR path, then of CM2_CONFIGS on the
#    cooperative-matrix-2 path (labelled cm2-...), one line each. `acc16` (f16 accumulators) is
#    not in the conformance run: its precision is for `engine perplexity --kl-divergence` on a
#    real model to judge (issue 56's rule).
# $OUT gets experiments.txt.
#
# Parameters (environment): BIN (.bench/new), SHAPES ("gemma3-1b:q4_k gemma3-4b:q4_k"), CONFIGS, CM2_CONFIGS,
# REPEAT (2), WORK (/tmp/kx), OUT, PROFILE (labels whose prefill step is also profiled per op,
# e.g. "default cm2-default"), ATTN_TOL (the conformance floor for attention_coopmat, 3e-3).
set -uo pipefail
BIN=${BIN:-.bench/new}
SHAPES=${SHAPES:-"gemma3-1b:q4_k gemma3-4b:q4_k"}
CONFIGS=${CONFIGS:-"default=- coopmat=TANDEM_VULKAN_COOPMAT_KERNEL=coopmat tiled=TANDEM_VULKAN_ATTN_COOPMAT=0 s2=TANDEM_VULKAN_TILED_SPLITS=2"}
CM2_CONFIGS=${CM2_CONFIGS:-"default=- tiled=TANDEM_VULKAN_ATTN_COOPMAT=0 acc16=TANDEM_VULKAN_CM2_ACC=f16"}
REPEAT=${REPEAT:-2}
WORK=${WORK:-/tmp/kx}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT" "$WORK"
log="$OUT/experiments.txt"

. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
export TANDEM_VULKAN_COOPMAT2=0 TANDEM_CONFORMANCE_VALIDATION=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$log"
chmod +x "$BIN/engine" "$BIN"/t/deps/* 2>/dev/null

if [ -x "$BIN/t/deps/vulkan_backend" ]; then
    echo "== vulkan_backend prefill (KHR)" | tee -a "$log"
    timeout 200 "$BIN/t/deps/vulkan_backend" prefill 2>&1 | grep -E "^test |panicked|left|right" | head -20 | tee -a "$log"
fi
if [ -x "$BIN/t/deps/conformance" ]; then
    echo "== conformance (KHR, tensor-core floor)" | tee -a "$log"
    TANDEM_CONFORMANCE_BACKENDS=vulkan TANDEM_CONFORMANCE_MIN_TOL=${ATTN_TOL:-3e-3} timeout 200 "$BIN/t/deps/conformance" 2>&1 \
        | grep -E "^test |panicked|attention" | head -20 | tee -a "$log"
fi

for pair in $SHAPES; do
    IFS=: read -r shape dtype <<<"$pair"
    gguf="$WORK/$shape-$dtype.gguf"
    "$BIN/engine" synth --shape "$shape" --dtype "$dtype" --out "$gguf" --force >/dev/null || continue
    for config in $CONFIGS $(for c in $CM2_CONFIGS; do echo "cm2:$c"; done); do
        path_env="TANDEM_VULKAN_COOPMAT2=0"
        case $config in cm2:*) config=${config#cm2:}; path_env="TANDEM_VULKAN_COOPMAT2=1"; config="cm2-$config";; esac
        label=${config%%=*}
        envs=${config#*=}
        envs=${envs//,/ }
        [ "$envs" = "-" ] && envs=""
        env $path_env $envs timeout 300 "$BIN/engine" bench --model "$gguf" --backend vulkan --prompt-tokens 512 \
            --gen-tokens 32 --chunk 512 --repeat "$REPEAT" --json >"$WORK/r.json" 2>"$WORK/err.txt" \
            || { echo "$pair $label: failed: $(tail -2 "$WORK/err.txt")" | tee -a "$log"; continue; }
        python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print('%-18s %-8s prefill %9.1f decode %7.1f' % (sys.argv[2], sys.argv[3], r['prefill_tokens_per_s']['median'], r['decode_tokens_per_s']['median']))" \
            "$WORK/r.json" "$pair" "$label" | tee -a "$log"
        # The per-op profile of a prefill step, for the configurations PROFILE names.
        case " ${PROFILE:-} " in *" $label "*)
            env $path_env $envs "$BIN/engine" bench --model "$gguf" --backend vulkan --prompt-tokens 512 \
                --gen-tokens 4 --chunk 512 --repeat 1 --profile --json >"$WORK/p.json" 2>/dev/null \
                && python3 -c "
import json,sys
for o in json.load(open(sys.argv[1]))['runs'][0]['profile']['prefill'][:6]:
    print('    %-44s %3d %8.3f ms' % (o['op'], o['nodes'], o['seconds'] * 1e3))" "$WORK/p.json" | tee -a "$log";;
        esac
    done
    rm -f "$gguf"
done
