#!/usr/bin/env bash
# bench/cm2-fixed.sh: do issue 54's cooperative-matrix kernels run faster as modules without
# specialisation-constant branches? (NVIDIA's compiler kept specialised-off branches in the KHR
# matmul at half its rate: bench/results/2026-11-28-prefill-khr.) Tandem only, one device call:
#   1. the conformance binary (DIR/t/deps/conformance, Vulkan alone) with each CONFORM entry:
#      q4_k and f16 products on the compile-time-tile `matmul_cm2c*` builds
#      (TANDEM_VULKAN_CM2_FIXED) and attention on `attention_coopmat0` (TANDEM_VULKAN_ATTN_FIXED);
#   2. bench/prefill-probe.sh on 4B q4_k and 4B f16 with VARIANTS: the default kernels, q4_k
#      decoded in `matmul_cm2`'s loads (and f16 on `matmul_cm2`) with spec-constant tiles, the
#      same on each compile-time tile, and the fixed attention;
#   3. batched decode at 32 sequences on 4B q4_k, `matmul_cm2` against its compile-time 64 x 32
#      build: `engine bench --batch 32 --prompt-tokens 128 --gen-tokens 64 --repeat 3`;
#   4. bench/decode-probe.sh on 4B f16: `matvec_f16` against `matvecf_f16`, its one-row
#      configuration as constants (TANDEM_VULKAN_MATVEC_FIXED=1), two rounds.
# CONFORM, VARIANTS, CELLS, B32 (step 3's variants, `name:VAR=VAL,...`) and DECODE (step 4's;
# empty: skipped) replace the lists, so the script probes other cm2 variants the same way (the
# alignment hints of MODE bit 3: bench/results/2026-11-29-cm2-hints).
# The JSON ends in $OUT/results.tar.gz; the summaries print on stdout.
# The compile-time builds measured no faster and were removed after that call; their default
# lists are kept as the record, and bench/cm2-hints.sh runs the same steps with its own lists.
# Here: `bash bench/package-device.sh .bench/new`. There (carrying .bench/new and .gl):
#   bash bench/cm2-fixed.sh 2>&1 | tee $OUT/cm2-fixed.log
# (Written when q4_k and f16 prefill took the KHR kernels on a cooperative-matrix-2 device unless
# TANDEM_VULKAN_CM2_Q4K=1 / TANDEM_VULKAN_CM2_F16=1, as set below. Since the hints became the
# default, `matmul_cm2` is the default there and those two variables are ignored:
# TANDEM_VULKAN_CM2_KHR=1 takes the KHR kernels.)
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}; B=${BUILD:-.bench/new}; WORK=${WORK:-/tmp}
mkdir -p "$OUT"
Q="TANDEM_VULKAN_CM2_Q4K=1,TANDEM_VULKAN_CM2_DEQUANT=0,TANDEM_VULKAN_CM2_F16=1"
F="TANDEM_VULKAN_CM2_FIXED"
T="TANDEM_CONFORMANCE_MIN_TOL=3e-3"
CONFORM=${CONFORM-"c128:$T,$Q,$F=128x128m2 c256h:$T,$Q,$F=128x256m2,TANDEM_VULKAN_CM2_ACC=f16 c32:$T,TANDEM_VULKAN_CM2_ROWS=16,$F=64x32m2 a0:$T,TANDEM_VULKAN_ATTN_FIXED=1"} \
VARIANTS=${VARIANTS-"base a0:TANDEM_VULKAN_ATTN_FIXED=1 spec:$Q c128m2:$Q,$F=128x128m2 c128m3:$Q,$F=128x128m3 c256m2:$Q,$F=128x256m2 c128m2h:$Q,$F=128x128m2,TANDEM_VULKAN_CM2_ACC=f16 c256m2h:$Q,$F=128x256m2,TANDEM_VULKAN_CM2_ACC=f16"} \
CELLS=${CELLS-"gemma3-4b:q4_k gemma3-4b:f16"} BUILDS="$B" OUT="$OUT/probe" WORK="$WORK" KEEP=1 \
    bash "$(dirname "${BASH_SOURCE[0]}")/prefill-probe.sh"
g=$WORK/gemma3-4b-q4_k.gguf
for v in ${B32-base "c32:$F=64x32m2" base "c32:$F=64x32m2"}; do
    name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
    r=$(env "${envs[@]}" timeout 120 "$B/engine" bench --model "$g" --backend vulkan --batch 32 --prompt-tokens 128 \
        --gen-tokens 64 --repeat 3 --json 2>/dev/null |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["runs"][0]; print(round(r["decode_tokens_per_s"]["median"],1))' 2>/dev/null)
    echo "4B q4_k batch 32 $name: decode ${r:-failed} tok/s"
done
[ -n "${DECODE-x}" ] && BUILDS="$B" CELLS="gemma3-4b:f16" VARIANTS="${DECODE:-base mvf:TANDEM_VULKAN_MATVEC_FIXED=1}" ROUNDS=2 \
    OUT="$OUT/decode" WORK="$WORK" bash "$(dirname "${BASH_SOURCE[0]}")/decode-probe.sh"
# The device tool brings back at most 8 files: the JSON packed into one.
tar -czf "$OUT/results.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d probe decode 2>/dev/null) && rm -rf "$OUT/probe" "$OUT/decode"
