set -uo pipefail
OUT0=$OUT
start=$(date +%s)
OUT=$OUT0/main SHAPES="gemma3-1b gemma3-4b" bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -30
echo "main took $(( $(date +%s) - start )) s"
for s in gemma3-1b gemma3-4b; do grep step $OUT0/main/$s-tandem-metrics.txt; grep -h "listening" $OUT0/main/$s-tandem.log; done
cd $OUT0 && tar czf s.tgz main && rm -rf main
