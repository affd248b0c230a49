#!/usr/bin/env bash
# Issue 31, call 3: 16-bit matvec_dot on the H100: conformance, A/B; then the 1B comparison.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
E=.devcarry/engine
R=$OUT/r; mkdir -p $R /tmp/w
echo "== conformance (vulkan, H100)"
TANDEM_CONFORMANCE_VALIDATION=0 TANDEM_CONFORMANCE_BACKENDS=vulkan timeout 240 ./.devcarry/deps/conformance 2>&1 | grep -E "^test |test result|panicked" -A1 | head -20
for s in gemma3-1b gemma3-4b; do [ -s /tmp/w/$s.gguf ] || $E synth --shape $s --dtype q4_k --out /tmp/w/$s.gguf >/dev/null || echo "synth $s failed"; done
b() { # name shape batch [env...]
  local name=$1 s=$2 bt=$3; shift 3
  local extra=""; case "$name" in *prof*) extra=--profile;; esac
  env "$@" timeout 200 $E bench $extra --model /tmp/w/$s.gguf --backend vulkan --batch $bt --prompt-tokens 512 --gen-tokens 64 --repeat 1 --kv-cache f16 --json --out $R/$name.json >/dev/null 2>/tmp/w/err || { echo "$name failed"; tail -2 /tmp/w/err; }
  python3 -c "import json,sys; r=json.load(open('$R/$name.json'))['runs']; print('$name', [(x['batch'], round(x['decode_tokens_per_s']['median'],1)) for x in r])" 2>/dev/null
}
for s in gemma3-1b gemma3-4b; do
  b $s-wide $s 1,8,16
  b $s-narrow $s 1,8 TANDEM_VULKAN_DOT_BITS=8
  b $s-nodot $s 1,8 TANDEM_VULKAN_INT_DOT=0
  b $s-b16-cm2off $s 16 TANDEM_VULKAN_CM2_ROWS=17
  b $s-b8-prof $s 8 TANDEM_VULKAN_PROFILE_KERNELS=1
done
OUT=$OUT/final SHAPES=gemma3-1b KV=f16 BATCHES=1,8,32 REPEAT=2 bash bench/batched-vs-llamacpp.sh 2>&1 | grep -v "^==" | tail -12
