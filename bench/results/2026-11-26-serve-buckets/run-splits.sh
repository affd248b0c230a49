set -uo pipefail
OUT0=$OUT
export PROMPT="Write a short story about a lighthouse keeper who finds a message in a bottle, and tell it in the voice of the keeper, with the sea, the light and the long nights in it."
OUT=$OUT0/split-4b DISTINCT=1 SKIP_PEER=1 SHAPES=gemma3-4b CLIENTS=8,32,64 BACKEND=vulkan+vulkan bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -5
OUT=$OUT0/layers-1b DISTINCT=1 SKIP_PEER=1 SHAPES=gemma3-1b CLIENTS=8,32 TANDEM_ARGS="--gpu-layers 13" bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -5
cd $OUT0 && tar czf s.tgz split-4b layers-1b && rm -rf split-4b layers-1b
