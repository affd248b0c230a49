#!/usr/bin/env bash
# bench/image-vs-llamacpp.sh: one image in, to the first logits, on the GPU (issue 58's speed
# cells): tandem's Vulkan backend (the vision tower and the language model both there) beside
# llama.cpp's `llama-mtmd-cli` with Vulkan, on the same `engine synth` model and mmproj files and
# the same image.
#
# Here, first: `../shared/peers/prepare-llamacpp-vulkan.sh .peer`, a release build stripped into
# $ENGINE's folder (`bash bench/package-device.sh .bench/new`), the Vulkan loader debs in .gl/.
# There (the device tool's `run`, carrying .bench/new, .gl and .peer):
#   SHAPES="gemma3-4b gemma3-27b" ENGINE=.bench/new/engine bash bench/image-vs-llamacpp.sh
# For each shape: `engine synth --dtype q4_k --mmproj` (a random SigLIP tower in llama.cpp's
# mmproj layout, f16 matrices), then
# - tandem: `engine bench --backend vulkan --image IMAGE --prompt-tokens 8 --gen-tokens 2
#   --repeat REPEAT` (its image round: one warm-up, then REPEAT timed encodings of the image
#   and prefills of its 256 tokens with "Describe this image."; `image.encode_ms` includes
#   the resize and normalisation, `image.first_logits_ms` is encoding plus prefill);
# - llama.cpp: `llama-mtmd-cli -ngl 99 -c 2048 --image IMAGE -p "Describe this image." -n 1`
#   `--chat-template gemma -v`, once to warm up and REPEAT times timed, each a fresh process;
#   from its log, "mtmd batch encoding done in E ms" (the tower alone, after its
#   preprocessing) and, from the log's timestamps, the time from "encoding mtmd batch" to
#   llama_perf's print after the first token (the tower, the image's tokens and the prompt's
#   rest; the few template tokens before the image are decoded earlier and not counted).
# $OUT gets report.md (medians, ratios `ours / peer`) and results.tar.gz (tandem's JSON and
# llama.cpp's logs).
#
# Parameters (environment): SHAPES ("gemma3-4b"), IMAGE (tests/fixtures/images/photo.png),
# ENGINE (.bench/new/engine), PEER (.peer), PEER_TARGETS (the llama.cpp tools to build:
# llama-mtmd-cli and llama-bench, which the build script asks for the device list), REPEAT (3), WORK (/tmp/img), OUT.
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-4b"}
IMAGE=${IMAGE:-tests/fixtures/images/photo.png}
ENGINE=${ENGINE:-.bench/new/engine}
PEER=${PEER:-.peer}
REPEAT=${REPEAT:-3}
WORK=${WORK:-/tmp/img}
OUT=${OUT:-$PWD/image-out}
mkdir -p "$OUT" "$WORK/logs"

. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
chmod +x "$ENGINE" 2>/dev/null
t0=$(date +%s)
TARGETS=${PEER_TARGETS:-"llama-mtmd-cli llama-bench"} OUTDIR=$WORK bash "$PEER/build-and-bench.sh" >"$OUT/build.log" 2>&1 ||
    { echo "llama.cpp did not build"; tail -20 "$OUT/build.log"; exit 1; }
echo "peer built in $(($(date +%s) - t0)) s"
mtmd=/tmp/lcpp/build/bin/llama-mtmd-cli
peer_env=(env LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu)

for shape in $SHAPES; do
    m="$WORK/$shape.gguf"
    mm="$WORK/$shape.mmproj.gguf"
    s=$(date +%s)
    "$ENGINE" synth --shape "$shape" --dtype q4_k --out "$m" --mmproj "$mm" --force >/dev/null ||
        { echo "synth failed: $shape"; continue; }
    echo "$shape: synth in $(($(date +%s) - s)) s"
    timeout 300 "$ENGINE" bench --model "$m" --mmproj "$mm" --backend vulkan --image "$IMAGE" \
        --prompt-tokens 8 --gen-tokens 2 --repeat "$REPEAT" --json --out "$WORK/logs/tandem-$shape.json" \
        >/dev/null 2>"$WORK/logs/tandem-$shape.err" || { echo "engine bench failed on $shape"; tail -5 "$WORK/logs/tandem-$shape.err"; }
    for i in $(seq 0 "$REPEAT"); do
        timeout 300 "${peer_env[@]}" "$mtmd" -m "$m" --mmproj "$mm" --image "$IMAGE" -p "Describe this image." \
            -n 1 -ngl 99 -c 2048 --temp 0 --chat-template gemma -v >"$WORK/logs/mtmd-$shape-$i.out" 2>"$WORK/logs/mtmd-$shape-$i.log" ||
            { echo "llama-mtmd-cli failed on $shape (run $i)"; tail -5 "$WORK/logs/mtmd-$shape-$i.log"; }
    done
    echo "done $shape"
    rm -f "$m" "$mm"
done

python3 - "$WORK/logs" "$REPEAT" <<'PY' | tee "$OUT/report.md"
import glob, json, os, re, statistics, sys
logs, repeat = sys.argv[1], int(sys.argv[2])
print("| shape | tower, images/s: ours / peer | to the first logits, images/s: ours / peer | ours: encode, prefill (ms; tokens) | peer: encode, the rest to the first logits (ms; tokens) |")
print("| --- | --- | --- | --- | --- |")
for t in sorted(glob.glob(f"{logs}/tandem-*.json")):
    shape = os.path.basename(t)[len("tandem-"):-len(".json")]
    try:
        im = json.load(open(t))["image"]
    except Exception as e:
        print(f"| {shape} | no tandem result ({e}) | | | |")
        continue
    enc, pev, ntok = [], [], None
    stamp = lambda line: (lambda m, s_, ms, us: 60 * int(m) + int(s_) + int(ms) / 1e3 + int(us) / 1e6)(*line.split()[0].split("."))
    for i in range(1, repeat + 1):  # run 0 is the warm-up
        try:
            lines = open(f"{logs}/mtmd-{shape}-{i}.log", errors="replace").read().splitlines()
        except OSError:
            continue
        start = next((l for l in lines if "encoding mtmd batch" in l), None)
        done = next((l for l in lines if "mtmd batch encoding done in" in l), None)
        end = next((l for l in lines if "llama_perf_context_print:" in l), None)
        p = next((re.search(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", l) for l in lines if "prompt eval time" in l), None)
        if start and done and end:
            enc.append(float(re.search(r"done in (\d+) ms", done).group(1)))
            pev.append((stamp(end) - stamp(start)) * 1e3 - enc[-1])
            ntok = int(p.group(1)) if p else None
    oe, of = im["encode_ms"], im["first_logits_ms"]
    ours = f"{oe:,.1f}, {of - oe:,.1f} ({im['prompt_tokens']})"
    if not enc:
        print(f"| {shape} | {1e3 / oe:.2f} / - | {1e3 / of:.2f} / - | {ours} | - |")
        continue
    pe, pp = statistics.median(enc), statistics.median(pev)
    pf = pe + pp
    print(f"| {shape} | {1e3 / oe:.2f} / {1e3 / pe:.2f} = {pe / oe:.2f} | {1e3 / of:.2f} / {1e3 / pf:.2f} = {pf / of:.2f} "
          f"| {ours} | {pe:,.1f}, {pp:,.1f} ({ntok}) |")
print("\nimages/s = 1000 / the median time of the timed runs (the tower's encoding; encoding plus the prefill of the image's and the prompt's tokens).")
PY
tar -czf "$OUT/results.tar.gz" -C "$WORK" logs
