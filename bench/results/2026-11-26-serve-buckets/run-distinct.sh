set -uo pipefail
OUT0=$OUT
export PROMPT="Write a short story about a lighthouse keeper who finds a message in a bottle, and tell it in the voice of the keeper, with the sea, the light and the long nights in it."
OUT=$OUT0/distinct DISTINCT=1 SHAPES="gemma3-1b gemma3-4b" bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -30
for s in gemma3-1b gemma3-4b; do grep -h "prompt\|step" $OUT0/distinct/$s-tandem-metrics.txt; done
cd $OUT0 && tar czf s.tgz distinct && rm -rf distinct
