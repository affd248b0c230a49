#!/usr/bin/env bash
# bench/threads-probe.sh: does the CPU half of a layer split lose to the GPU driver's waiting
# thread? On the GPU machine (the device tool's `run`, carrying .devcarry and .gl): 1B q4_k,
# `--backend vulkan --gpu-layers 13` with `[backend.cpu] threads` = 16, 15, 14, 12, 8, then the
# CPU backend alone at 16 and 15 threads (prompt 128, 64 generated, 2 repeats). JSON into $OUT.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
E=.devcarry/engine; W=/tmp/t; mkdir -p $W
$E synth --shape gemma3-1b --dtype q4_k --out $W/1b.gguf --force >/dev/null
$E bench --model $W/1b.gguf --backend vulkan --prompt-tokens 64 --gen-tokens 16 --batch 1 --repeat 1 >/dev/null 2>&1
for th in 16 15 14 12 8; do
  printf '[backend.cpu]\nthreads = %d\n' $th > $W/c$th.toml
  echo "== split threads=$th"
  timeout 120 $E --config $W/c$th.toml bench --model $W/1b.gguf --backend vulkan --gpu-layers 13 --prompt-tokens 128 --gen-tokens 64 --batch 1 --repeat 2 --out $OUT/split-t$th.json 2>/dev/null | tail -1
done
for th in 16 15; do
  echo "== cpu alone threads=$th"
  timeout 150 $E --config $W/c$th.toml bench --model $W/1b.gguf --backend cpu --prompt-tokens 128 --gen-tokens 64 --batch 1 --repeat 2 --out $OUT/cpu-t$th.json 2>/dev/null | tail -1
done
