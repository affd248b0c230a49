set -uo pipefail
OUT0=$OUT
for b in off on; do
OUT=$OUT0/buckets-$b SKIP_PEER=1 SHAPES="gemma3-1b gemma3-4b" CLIENTS=32,64 TANDEM_ARGS="--step-buckets $b" bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -6
for s in gemma3-1b gemma3-4b; do grep step $OUT0/buckets-$b/$s-tandem-metrics.txt; done
done
cd $OUT0 && tar czf s.tgz buckets-* && rm -rf buckets-*
