#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
BIN=${BIN:-.bench/new}; chmod +x $BIN/engine; mkdir -p /tmp/m
E=$BIN/engine
one() { # label model args...
  local label=$1 g=$2; shift 2
  $E bench --model $g "$@" --prompt-tokens 64 --gen-tokens 96 --repeat 2 --json > /tmp/o.json 2>/dev/null
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]
h=' '.join('%s ex %.2f wait %.2f'%(u['unit'],u['execute'],u['wait']) for u in (r.get('split_host_ms') or []))
print('%-44s decode %7.1f p50 %.2f  %s'%(sys.argv[2], r['decode_tokens_per_s']['median'], r['token_latency_ms']['p50'], h))" /tmp/o.json "$label"
}
for shape in gemma3-1b:13 gemma3-4b:17; do
IFS=: read -r s n <<<"$shape"; g=/tmp/m/$s.gguf; $E synth --shape $s --dtype q4_k --out $g --force >/dev/null
for vw in 0 3000; do
  TANDEM_VULKAN_WAIT_SPIN_US=$vw one "$s vulkan vwait=$vw" $g --backend vulkan
  for us in 200 20 50; do
    TANDEM_VULKAN_WAIT_SPIN_US=$vw TANDEM_CPU_SPIN_US=$us one "$s ngl$n vwait=$vw cspin=$us" $g --backend vulkan --gpu-layers $n
  done
done
TANDEM_CPU_SPIN_US=50 one "$s cpu cspin=50" $g --backend cpu
rm -f $g; done
