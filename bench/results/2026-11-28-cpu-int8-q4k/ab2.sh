# usage: ab2.sh model P G pairs -> lines "engine prefill decode"
cd /tmp/tandem-cpu-bench
printf '[backend.cpu]\nthreads = 2\n' > /tmp/ab.toml
for i in $(seq 1 $4); do
for e in /tmp/base/engine /work/cputarget/release/engine; do
  python3 /tmp/clean.py $e --config /tmp/ab.toml bench --model $1 --backend cpu --prompt-tokens $2 --gen-tokens $3 --repeat 2 --json 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin)['runs'][0]; print('$1', '$e', '%.1f %.1f' % (r['prefill_tokens_per_s']['median'], r['decode_tokens_per_s']['median']))"
done; done
