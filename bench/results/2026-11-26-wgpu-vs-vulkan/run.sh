set -uo pipefail
OUT0=$OUT
OUT=$OUT0/w1 ENGINE=.devcarry/wgpu/engine SHAPES=gemma3-1b STEP_TIMEOUT=120 bash .devcarry/wgpu-vs-vulkan.sh 2>&1 | grep -v "^==" | tail -40
cd $OUT0 && tar czf w.tgz w1 && rm -rf w1
