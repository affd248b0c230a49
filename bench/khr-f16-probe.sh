#!/usr/bin/env bash
# bench/khr-f16-probe.sh: where matmul_khr's time goes on f16 weights (issue 54's 4B f16 cells),
# on the GPU machine, one call: `engine synth --shape gemma3-4b --dtype D` for each D of DTYPES,
# then on the KHR path (`TANDEM_VULKAN_COOPMAT2=0`) for each kernel choice of the list
# (`TANDEM_VULKAN_COOPMAT_KERNEL`: khr, the real kernel; khrp, `matmul_khrp_f16`, the same
# kernel without its f16 weight loads, constant weights and wrong results) `engine bench
# --prompt-tokens 512 --chunk 512 --repeat 3` and its `--profile`, printing the prefill median
# and the per-op profile of one step (ms). JSON under $OUT (b-*.json, p-*.json, e-*.txt).
# Here, first: `bash bench/package-device.sh .bench/new`. There (carrying .bench/new and .gl):
#   DTYPES=f16 bash bench/khr-f16-probe.sh
chmod +x .bench/new/engine; . bench/vulkan-env.sh >/dev/null 2>&1; mkdir -p $OUT; E=.bench/new/engine
for dt in ${DTYPES:-f16 q4_k}; do
  $E synth --shape gemma3-4b --dtype $dt --out /tmp/m-$dt.gguf --force >/dev/null
  vs=${KERNELS:-"khrp khr khrp"}; [ $dt != f16 ] && vs="khr"
  for v in $vs; do
    TANDEM_VULKAN_COOPMAT2=0 TANDEM_VULKAN_COOPMAT_KERNEL=$v timeout 120 $E bench --model /tmp/m-$dt.gguf --backend vulkan --prompt-tokens 512 --gen-tokens 4 --chunk 512 --repeat 3 --json > $OUT/b-$dt-$v.json 2>$OUT/e-$dt-$v.txt
    TANDEM_VULKAN_COOPMAT2=0 TANDEM_VULKAN_COOPMAT_KERNEL=$v timeout 120 $E bench --model /tmp/m-$dt.gguf --backend vulkan --prompt-tokens 512 --gen-tokens 4 --chunk 512 --repeat 1 --profile --json > $OUT/p-$dt-$v.json 2>/dev/null
    python3 - $OUT/b-$dt-$v.json $OUT/p-$dt-$v.json $dt $v <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["runs"][0]
p = json.load(open(sys.argv[2]))
prof = p["runs"][0].get("profile", {}).get("prefill", [])
mm = {x.get("op"): round(x.get("seconds", 0) * 1000, 2) for x in prof if isinstance(x, dict)}
print(sys.argv[3], sys.argv[4], "prefill", round(b["prefill_tokens_per_s"]["median"], 1), {k: v for k, v in mm.items() if v > 0.5})
PY
  done
  rm -f /tmp/m-$dt.gguf
done
