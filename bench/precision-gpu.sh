#!/usr/bin/env bash
# bench/precision-gpu.sh: the Vulkan backend's `precision = "fast"` against `"exact"` on the GPU
# machine, in one device call (issue 56):
#   1. the precision rule on the real default model (docs/precision.md): `engine perplexity
#      --backend vulkan --chunk CHUNK` over the shipped text (CHUNK 4 by default: decode-shaped
#      products, the integer dots; 512: prefill-shaped ones, the tensor-core kernels; CM2=0 runs
#      both with NV cooperative matrix 2 off, the KHR path), exact as the reference, fast against it
#      (mean and 99th percentile KL, same top token, both perplexities). The default model
#      (253 MB) is over one call's carry (64 MiB with the tracked tree, ~17 MB): it comes in
#      parts (MODEL_PARTS, default .mparts: the files MODEL_PARTS/p*/part*, in name order) and
#      is checked against MODEL_SHA256 when given. A carried folder does not stay on the machine
#      into the next call, /tmp does: split the model into six parts of 42.2 MB here
#      (`split -b 42200000 -d -a 1 MODEL tmp`, each into .mparts/pN/), send one per call of the
#      warm machine with `cp -r .mparts/p* /tmp/mp/`, then run this with MODEL_PARTS=/tmp/mp;
#   2. batched decode at BATCHES (1,8,32) sequences, exact and fast alternating, on SHAPES
#      (`engine synth` q4_k files);
#   3. speculative decoding's verification curve (`--verify-rows 16`) exact and fast on
#      VERIFY_SHAPES (the shapes of SHAPES to measure it on; BATCH_SHAPES, default SHAPES, are
#      those of step 2).
# Here: `bash bench/package-device.sh .bench/new`; there (carrying .bench and .gl):
#   SHAPES="gemma3-1b gemma3-4b gemma3-27b" VERIFY_SHAPES="gemma3-27b" ENGINE=.bench/new/engine \
#     bash bench/precision-gpu.sh
# Outputs in OUT (default $PWD/precision-gpu-out): precision-gpu.tar.gz (every JSON and text)
# and precision-gpu.log.
set -uo pipefail
E=${ENGINE:-.bench/new/engine}
SHAPES=${SHAPES:-"gemma3-1b gemma3-4b"}
VERIFY_SHAPES=${VERIFY_SHAPES:-}
BATCH_SHAPES=${BATCH_SHAPES:-$SHAPES}
BATCHES=${BATCHES:-1,8,32}
P=${PROMPT_TOKENS:-512}
G=${GEN_TOKENS:-128}
R=${REPEAT:-2}
PARTS=${MODEL_PARTS:-.mparts}
CHUNK=${CHUNK:-4}
[ -n "${CM2:-}" ] && export TANDEM_VULKAN_COOPMAT2=$CM2
OUT=${OUT:-$PWD/precision-gpu-out}
W=${WORK:-/tmp/precision-gpu}
TEXT=tests/fixtures/text/around-the-world-in-80-days-1-5.txt
mkdir -p "$OUT" "$W/r"
exec > >(tee "$OUT/precision-gpu.log") 2>&1
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
chmod +x "$E" 2>/dev/null
echo "CHUNK=$CHUNK CM2=${CM2:-} SHAPES=\"$SHAPES\" BATCH_SHAPES=\"$BATCH_SHAPES\" VERIFY_SHAPES=\"$VERIFY_SHAPES\" BATCHES=$BATCHES PROMPT_TOKENS=$P GEN_TOKENS=$G REPEAT=$R bash bench/precision-gpu.sh" | tee "$W/r/command.txt"
pack() { tar -czf "$OUT/precision-gpu.tar.gz" -C "$W/r" .; }

# 1. The rule on the default model.
if compgen -G "$PARTS/p*/part*" >/dev/null; then
    cat $(ls "$PARTS"/p*/part* | sort) >"$W/default.gguf"
    got=$(sha256sum "$W/default.gguf" | cut -c1-64)
    echo "default model: $(stat -c %s "$W/default.gguf") bytes, sha256 $got"
    if [ -n "${MODEL_SHA256:-}" ] && [ "$got" != "$MODEL_SHA256" ]; then
        echo "the parts do not make the default model (want $MODEL_SHA256): KL skipped"
    else
        for p in exact fast; do printf '[backend.vulkan]\nprecision = "%s"\n' "$p" >"$W/$p.toml"; done
        "$E" --config "$W/exact.toml" perplexity --model "$W/default.gguf" --backend vulkan --file "$TEXT" \
            --chunk "$CHUNK" --kl-divergence-base "$W/exact.kl" >"$W/r/perplexity-vulkan-exact.txt" 2>&1
        "$E" --config "$W/fast.toml" perplexity --model "$W/default.gguf" --backend vulkan --file "$TEXT" \
            --chunk "$CHUNK" --kl-divergence "$W/exact.kl" --json >"$W/r/kl-vulkan-fast-vs-exact.json" 2>"$W/r/kl-vulkan-fast.stderr"
        tail -3 "$W/r/perplexity-vulkan-exact.txt"
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('vulkan fast vs exact:', d['kl_divergence'])" \
            "$W/r/kl-vulkan-fast-vs-exact.json"
        "$E" --config "$W/fast.toml" backends >"$W/r/backends-fast.txt" 2>&1
    fi
    pack
fi

# 2 and 3. Synthetic shapes.
for shape in $SHAPES; do
    m="$W/$shape.gguf"
    "$E" synth --shape "$shape" --dtype q4_k --out "$m" >/dev/null || { echo "synth $shape failed"; continue; }
    [[ " $BATCH_SHAPES " == *" $shape "* ]] && orders="exact fast exact fast" || orders=""
    for p in $orders; do
        n=$(ls "$W/r" | grep -c "^batched-$shape-$p" || true)
        "$E" bench --model "$m" --backend vulkan --precision "$p" --batch "$BATCHES" --prompt-tokens "$P" \
            --gen-tokens "$G" --repeat "$R" --json --out "$W/r/batched-$shape-$p-$((n + 1)).json" \
            >/dev/null 2>"$W/r/batched-$shape-$p-$((n + 1)).stderr"
        python3 - "$W/r/batched-$shape-$p-$((n + 1)).json" "$shape $p" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[2], d["backend"].get("precision"), " ".join(
    "b%d %.1f" % (r["batch"], r["decode_tokens_per_s"]["median"]) for r in d["runs"]))
PY
    done
    if [[ " $VERIFY_SHAPES " == *" $shape "* ]]; then
        for p in exact fast; do
            "$E" bench --model "$m" --backend vulkan --precision "$p" --prompt-tokens "$P" --gen-tokens "$G" \
                --repeat "$R" --verify-rows 16 --out "$W/r/verify-$shape-$p.json" \
                >"$W/r/verify-$shape-$p.txt" 2>&1
            echo "== verify $shape $p"; tail -8 "$W/r/verify-$shape-$p.txt"
        done
    fi
    rm -f "$m"
    pack
done
pack
ls -la "$OUT"
