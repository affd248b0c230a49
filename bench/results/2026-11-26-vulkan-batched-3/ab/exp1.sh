#!/usr/bin/env bash
# Issue 31 experiments, call 1: conformance on the H100, ranked vs full greedy on a synth model,
# b8 profiles and A/B knobs.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
E=.devcarry/engine
R=$OUT/r; mkdir -p $R /tmp/w
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== conformance (vulkan, H100)"
( time TANDEM_CONFORMANCE_VALIDATION=0 TANDEM_CONFORMANCE_BACKENDS=vulkan timeout 240 ./.devcarry/deps/conformance 2>&1 | tail -5 ) 2>&1
for s in gemma3-1b gemma3-4b; do $E synth --shape $s --dtype q4_k --out /tmp/w/$s.gguf >/dev/null || echo "synth $s failed"; done
for mode in "--temperature 0" "--temperature 1 --top-k 64 --seed 7"; do
  echo "== ranked vs full, $mode (1B synth)"
  $E run --model /tmp/w/gemma3-1b.gguf --backend vulkan --prompt "The quick brown fox" --max-tokens 48 $mode > /tmp/w/ranked.txt 2>/tmp/w/ranked.err
  TANDEM_RANKED_LOGITS=0 $E run --model /tmp/w/gemma3-1b.gguf --backend vulkan --prompt "The quick brown fox" --max-tokens 48 $mode > /tmp/w/full.txt 2>/tmp/w/full.err
  cmp /tmp/w/ranked.txt /tmp/w/full.txt && echo "ranked == full ($(wc -c </tmp/w/ranked.txt) bytes)"; tail -2 /tmp/w/ranked.err
done
b() { # name shape batch [env...]
  local name=$1 s=$2 bt=$3; shift 3
  local extra=""; case "$name" in *prof*) extra=--profile;; esac
  env "$@" timeout 200 $E bench $extra --model /tmp/w/$s.gguf --backend vulkan --batch $bt --prompt-tokens 512 --gen-tokens 64 --repeat 1 --kv-cache f16 --json --out $R/$name.json >/dev/null 2>/tmp/w/err || { echo "$name failed"; tail -2 /tmp/w/err; }
  python3 -c "import json,sys; r=json.load(open('$R/$name.json'))['runs']; print('$name', [(x['batch'], round(x['decode_tokens_per_s']['median'],1)) for x in r])" 2>/dev/null
}
for s in gemma3-1b gemma3-4b; do
  b $s-b8-default $s 8
  b $s-b8-cm2 $s 8 TANDEM_VULKAN_CM2_ROWS=8
  b $s-b8-nc8 $s 8 TANDEM_VULKAN_ROWS_NC=8
  b $s-b8-nc2 $s 8 TANDEM_VULKAN_ROWS_NC=2
  b $s-b16-default $s 16
  b $s-b16-cm2 $s 16 TANDEM_VULKAN_CM2_ROWS=8
  b $s-b32-rows $s 32 TANDEM_VULKAN_CM2_ROWS=33
  b $s-b32-default $s 32
  b $s-b8-prof $s 8 TANDEM_VULKAN_PROFILE_KERNELS=1
  b $s-b1-prof $s 1 TANDEM_VULKAN_PROFILE_KERNELS=1
done
