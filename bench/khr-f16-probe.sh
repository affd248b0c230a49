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
# KERNELS applies to every dtype (default: "khrp khr khrp" for f16, "khr" for the others); with
# CONFORM=1 the conformance binary (Vulkan alone, KHR path, the tensor-core floor) runs first
# once per kernel of KERNELS, its summary in $OUT/c-<kernel>.txt. SHAPE (default gemma3-4b) is
# the synth shape; BENCH_ARGS go to every `engine bench` (e.g. "--kv-cache f16"); CM2=1 benches
# with NV cooperative matrix 2 on (the KERNELS choice applies where the product takes a KHR kernel).
chmod +x .bench/new/engine .bench/new/t/deps/* 2>/dev/null; . bench/vulkan-env.sh >/dev/null 2>&1; mkdir -p $OUT; E=.bench/new/engine
if [ "${CONFORM:-0}" = 1 ]; then
  for v in ${KERNELS:-khr}; do
    TANDEM_VULKAN_COOPMAT2=0 TANDEM_VULKAN_COOPMAT_KERNEL=$v TANDEM_CONFORMANCE_VALIDATION=0 TANDEM_CONFORMANCE_BACKENDS=vulkan TANDEM_CONFORMANCE_MIN_TOL=3e-3 \
      timeout 200 .bench/new/t/deps/conformance > $OUT/c-$v.txt 2>&1
    echo "conformance $v rc=$? $(grep -E '^test result' $OUT/c-$v.txt | head -1)"; grep -E "panicked|FAILED|failed" $OUT/c-$v.txt | head -5
  done
fi
for dt in ${DTYPES:-f16 q4_k}; do
  $E synth --shape ${SHAPE:-gemma3-4b} --dtype $dt --out /tmp/m-$dt.gguf --force >/dev/null
  vs=${KERNELS:-"khrp khr khrp"}; [ -z "$KERNELS" ] && [ $dt != f16 ] && vs="khr"
  for v in $vs; do
    TANDEM_VULKAN_COOPMAT2=${CM2:-0} TANDEM_VULKAN_COOPMAT_KERNEL=$v timeout 120 $E bench --model /tmp/m-$dt.gguf --backend vulkan --prompt-tokens 512 --gen-tokens 4 --chunk 512 --repeat 3 $BENCH_ARGS --json > $OUT/b-$dt-$v.json 2>$OUT/e-$dt-$v.txt
    TANDEM_VULKAN_COOPMAT2=${CM2:-0} TANDEM_VULKAN_COOPMAT_KERNEL=$v timeout 120 $E bench --model /tmp/m-$dt.gguf --backend vulkan --prompt-tokens 512 --gen-tokens 4 --chunk 512 --repeat 1 $BENCH_ARGS --profile --json > $OUT/p-$dt-$v.json 2>/dev/null
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
