set -uo pipefail
OUT0=$OUT
OUT=$OUT0/shapes512-4b SKIP_PEER=1 SHAPES=gemma3-4b TANDEM_STEP_SHAPES=512 bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -5
OUT=$OUT0/split-4b SKIP_PEER=1 SHAPES=gemma3-4b CLIENTS=8,32 BACKEND=vulkan+vulkan TANDEM_STEP_SHAPES=512 bash bench/vs-llama-server.sh 2>&1 | tail -4
cd $OUT0 && tar czf s.tgz shapes512-4b split-4b && rm -rf shapes512-4b split-4b
