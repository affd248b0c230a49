#!/usr/bin/env bash
# bench/package-device.sh: builds here what a device call of bench/khr-experiments.sh or
# bench/prefill-vs-llamacpp.sh runs, stripped, into one folder to carry (64 MiB a call):
#   DIR/engine and DIR/libtandem_backend_{vulkan,cpu}.so   (release build; the engine finds the
#                                                          plugins beside itself)
#   DIR/t/deps/{vulkan_backend,conformance}                (release test binaries; with
#   DIR/t/libtandem_backend_{vulkan,cpu}.so                 their plugins in the folder above)
# Usage: bench/package-device.sh [DIR]   (default .bench/new; CARGO_TARGET_DIR defaults to
# /work/reltarget so a debug test run here is not disturbed). Then, e.g., the device tool's `run`
# with carry [".bench", ".gl", ".peer"]: `BIN=.bench/new bash bench/khr-experiments.sh`.
set -euo pipefail
dir=${1:-.bench/new}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/reltarget}
cargo build --release -p tandem-cli -p tandem-backend-vulkan -p tandem-backend-cpu
cargo test --release -p tandem-conformance --test vulkan_backend --test conformance --no-run
mkdir -p "$dir/t/deps"
rel="$CARGO_TARGET_DIR/release"
for f in engine libtandem_backend_vulkan.so libtandem_backend_cpu.so; do
    strip -o "$dir/$f" "$rel/$f"
done
cp "$dir"/libtandem_backend_*.so "$dir/t/"
for t in vulkan_backend conformance; do
    bin=$(ls -t "$rel"/deps/"$t"-* | grep -v '\.d$' | head -1)
    strip -o "$dir/t/deps/$t" "$bin"
done
du -sh "$dir"
