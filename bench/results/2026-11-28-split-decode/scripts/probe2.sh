#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
BIN=${BIN:-.bench/new}; chmod +x $BIN/engine; mkdir -p /tmp/m
E=$BIN/engine
for pair in gemma3-4b:f16 gemma3-4b:q4_k; do
  IFS=: read -r shape dtype <<<"$pair"; g=/tmp/m/$shape-$dtype.gguf
  $E synth --shape $shape --dtype $dtype --out $g --force >/dev/null
  for cm2 in 0 1; do
    echo "== $pair cm2=$cm2"
    TANDEM_VULKAN_PROFILE_KERNELS=1 TANDEM_VULKAN_COOPMAT2=$cm2 $E bench --model $g --backend vulkan --prompt-tokens 512 --gen-tokens 4 --chunk 512 --repeat 2 --profile --json > $OUT/p-$shape-$dtype-$cm2.json 2>/dev/null
    python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))['runs'][0]
print('prefill', r['prefill_tokens_per_s']['median'])
p=r['profile']['prefill']
print('   total %.2f ms'%(sum(o['seconds'] for o in p)*1e3))
for o in p[:10]: print('   %-60s %3d %8.3f ms'%(o['op'],o['nodes'],o['seconds']*1e3))" $OUT/p-$shape-$dtype-$cm2.json
  done
  rm -f $g
done
g=/tmp/m/1b.gguf; $E synth --shape gemma3-1b --dtype q4_k --out $g --force >/dev/null
echo "== 1b cpu only"; $E bench --model $g --backend cpu --prompt-tokens 64 --gen-tokens 64 --repeat 2 --json > $OUT/cpu1b.json 2>/dev/null
python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(r['decode_tokens_per_s']['median'], r.get('split_host_ms'))" $OUT/cpu1b.json
for spin in true false; do
echo "== 1b ngl13 spin=$spin"; printf '[backend.cpu]\nspin = %s\n' $spin > /tmp/c.toml
$E --config /tmp/c.toml bench --model $g --backend vulkan --gpu-layers 13 --prompt-tokens 64 --gen-tokens 64 --repeat 2 --json > $OUT/ngl-$spin.json 2>/dev/null
python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(r['decode_tokens_per_s']['median'], r.get('split_host_ms'))" $OUT/ngl-$spin.json
done
