set -uo pipefail
OUT0=$OUT
export PROMPT="Write a short story about a lighthouse keeper who finds a message in a bottle, and tell it in the voice of the keeper, with the sea, the light and the long nights in it."
OUT=$OUT0/split-4b DISTINCT=1 SKIP_PEER=1 SHAPES=gemma3-4b CLIENTS=8,32,64 BACKEND=vulkan+vulkan bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -5
grep -h step $OUT0/split-4b/*metrics.txt
cd $OUT0 && tar czf s.tgz split-4b && rm -rf split-4b
