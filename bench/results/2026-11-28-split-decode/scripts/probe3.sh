#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
BIN=${BIN:-.bench/new}; chmod +x $BIN/engine; mkdir -p /tmp/m
E=$BIN/engine
one() { # label model args...
  local label=$1 g=$2; shift 2
  $E --config /tmp/c.toml bench --model $g "$@" --prompt-tokens 64 --gen-tokens 64 --repeat 2 --json > /tmp/o.json 2>/dev/null
  python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]
h=' '.join('%s ex %.2f wait %.2f'%(u['unit'],u['execute'],u['wait']) for u in (r.get('split_host_ms') or []))
print('%-40s decode %7.1f  %s'%(sys.argv[2], r['decode_tokens_per_s']['median'], h))" /tmp/o.json "$label"
}
for shape in gemma3-1b:13 gemma3-4b:17; do
IFS=: read -r s n <<<"$shape"; g=/tmp/m/$s.gguf; $E synth --shape $s --dtype q4_k --out $g --force >/dev/null
for cfg in "spin=true" "spin=false" "spin=true threads=8" "spin=false threads=8" "spin=true threads=15"; do
  : > /tmp/c.toml; echo "[backend.cpu]" >> /tmp/c.toml; for kv in $cfg; do echo "${kv%%=*} = ${kv#*=}" >> /tmp/c.toml; done
  one "$s cpu $cfg" $g --backend cpu
  one "$s ngl$n $cfg" $g --backend vulkan --gpu-layers $n
  [ "$cfg" = "spin=true" ] && for us in 0 20 1000; do TANDEM_CPU_SPIN_US=$us one "$s ngl$n $cfg spin_us=$us" $g --backend vulkan --gpu-layers $n; TANDEM_CPU_SPIN_US=$us one "$s cpu $cfg spin_us=$us" $g --backend cpu; done
done
rm -f $g; done
