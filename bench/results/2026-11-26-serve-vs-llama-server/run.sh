set -uo pipefail
OUT0=$OUT
OUT=$OUT0/main SHAPES="gemma3-1b gemma3-4b" bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -24
OUT=$OUT0/shapes512 SKIP_PEER=1 SHAPES=gemma3-1b CLIENTS=32,64 TANDEM_STEP_SHAPES=512 bash bench/vs-llama-server.sh 2>&1 | grep -v "^==" | tail -4
cd $OUT0 && tar czf s.tgz main shapes512 && rm -rf main shapes512
