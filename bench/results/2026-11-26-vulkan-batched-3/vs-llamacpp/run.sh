#!/usr/bin/env bash
# Issue 31's comparison for SHAPES x DTYPES, then tandem's per-kernel profiles at 1, 8, 32.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
mkdir -p $OUT/final $OUT/prof
OUT=$OUT/final SHAPES="$SHAPES" DTYPES="$DTYPES" KV=f16 BATCHES=1,8,32 REPEAT=${REPEAT:-2} bash bench/batched-vs-llamacpp.sh 2>&1 | grep -v "^==" | tail -14
for s in $SHAPES; do for d in $DTYPES; do
  g=/tmp/tandem-batched/$s-$d.gguf
  TANDEM_VULKAN_PROFILE_KERNELS=1 timeout 300 .devcarry/engine bench --profile --model $g --backend vulkan --batch 1,8,32 --prompt-tokens 512 --gen-tokens 32 --repeat 1 --kv-cache f16 --json --out $OUT/prof/$s-$d.json >/dev/null 2>/tmp/prof.err || { echo "profile $s-$d failed"; tail -2 /tmp/prof.err; }
done; done
rm -f /tmp/tandem-batched/gemma3-4b-f16.gguf
