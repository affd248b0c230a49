#!/usr/bin/env bash
# bench/kernel-stats.sh: the driver's statistics (NVIDIA: register counts) of tandem's prefill
# product pipelines beside llama.cpp's, for issue 54's cooperative-matrix-2 question (why
# tandem's `matmul_cm2` decoding q4_k in its loads runs at half `matmul_khr`'s rate where
# llama.cpp's `mul_mm_cm2` is faster than both). One device call, tandem and llama.cpp built
# from the same kit as bench/prefill-vs-llamacpp.sh. For SHAPE (gemma3-4b) q4_k: a 512-row
# prefill on each VARIANT (`name:VAR=VAL,...`) with `TANDEM_VULKAN_PIPELINE_STATS=FILTER` and no
# pipeline cache (every pipeline compiled, so the driver reports on each), then llama-bench -p
# 512 with `GGML_VK_PIPELINE_STATS=LLAMA_FILTER`. Prints the statistics lines; all output in
# $OUT/stats-*.txt. Then (PROBE=1) bench/prefill-probe.sh's timings of the same variants.
# Here: `bash bench/package-device.sh .bench/new`, `../shared/peers/prepare-llamacpp-vulkan.sh
# .peer`. There (carrying .bench/new, .gl and .peer): `bash bench/kernel-stats.sh`.
set -uo pipefail
SHAPE=${SHAPE:-gemma3-4b}; E=${ENGINE:-.bench/new/engine}; PEER=${PEER:-.peer}
OUT=${OUT:-$PWD/bench-out}; WORK=${WORK:-/tmp}; FILTER=${FILTER:-matmul}; LLAMA_FILTER=${LLAMA_FILTER:-matmul}
VARIANTS=${VARIANTS:-khr:TANDEM_VULKAN_CM2_KHR=1 cm2load:TANDEM_VULKAN_CM2_DEQUANT=0 cm2deq}
mkdir -p "$OUT"; chmod +x "$E"; . "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh" >/dev/null 2>&1
g=$WORK/$SHAPE-q4_k.gguf
[ -s "$g" ] || "$E" synth --shape "$SHAPE" --dtype q4_k --out "$g" --force >/dev/null || exit 1
for v in $VARIANTS; do
    name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
    env "${envs[@]}" TANDEM_PIPELINE_CACHE=0 TANDEM_VULKAN_PIPELINE_STATS="$FILTER" timeout 120 "$E" bench --model "$g" \
        --backend vulkan --prompt-tokens 512 --chunk 512 --gen-tokens 4 --repeat 1 >/dev/null 2>"$OUT/stats-$name.txt"
    echo "tandem $name:"; grep "pipeline stats" "$OUT/stats-$name.txt" | sort -u | sed 's/^/  /'
done
if TARGETS="llama-bench" OUTDIR=$OUT bash "$PEER/build-and-bench.sh" >"$OUT/build.log" 2>&1; then
    GGML_VK_PIPELINE_STATS="$LLAMA_FILTER" timeout 120 env LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu \
        /tmp/lcpp/build/bin/llama-bench -m "$g" -p 512 -n 0 -fa 1 -ngl 99 -r 1 >/dev/null 2>"$OUT/stats-llama.txt"
    echo "llama.cpp:"; grep -A12 "pipeline stats for" "$OUT/stats-llama.txt" | head -120 | sed 's/^/  /'
else
    echo "llama.cpp did not build"; tail -5 "$OUT/build.log"
fi
if [ "${PROBE:-0}" = 1 ]; then
    BUILDS="$(dirname "$E")" CELLS="$SHAPE:q4_k" VARIANTS="$VARIANTS" OUT="$OUT/probe" bash "$(dirname "${BASH_SOURCE[0]}")/prefill-probe.sh"
    # The device tool brings back at most 8 files.
    tar -czf "$OUT/probe.tar.gz" -C "$OUT" probe && rm -rf "$OUT/probe"
fi
