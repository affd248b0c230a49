#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
BIN=${BIN:-.bench/new}; chmod +x $BIN/engine; mkdir -p /tmp/m
E=$BIN/engine
for shape in gemma3-1b:13 gemma3-4b:17; do
IFS=: read -r s n <<<"$shape"; g=/tmp/m/$s.gguf; $E synth --shape $s --dtype q4_k --out $g --force >/dev/null
$E bench --model $g --backend vulkan --gpu-layers $n --prompt-tokens 512 --gen-tokens 4 --chunk 512 --repeat 2 --profile --json > $OUT/sp-$s.json 2>/dev/null
python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))['runs'][0]
print(sys.argv[1], 'prefill', r['prefill_tokens_per_s']['median'], 'ttft', r['ttft_ms'])
p=r['profile']['prefill']
print('   total %.2f ms'%(sum(o['seconds'] for o in p)*1e3))
for o in p[:14]: print('   %-50s %3d %8.3f ms'%(o['op'],o['nodes'],o['seconds']*1e3))" $OUT/sp-$s.json
rm -f $g; done
