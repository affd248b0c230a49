#!/usr/bin/env bash
# bench/prefill-vs-llamacpp.sh: prompt processing (and decode at batch 1) of tandem's Vulkan
# backend beside llama.cpp's, on both cooperative-matrix paths, in one device run on the same
# `engine synth` files (issue 54's measurement).
#
# Here, first: `../shared/peers/prepare-llamacpp-vulkan.sh .peer`, a release build stripped into
# $ENGINE's folder (engine and the plugins), the Vulkan loader debs in .gl/ (see bench/device.sh).
# There (the device tool's `run`, carrying .peer, the build and .gl):
#   SHAPES="gemma3-1b:q4_k gemma3-4b:q4_k" ENGINE=.bench/new/engine bash bench/prefill-vs-llamacpp.sh
# For each shape:dtype it writes one GGUF, then for each path in PATHS (cm2: NV cooperative matrix
# 2 on in both engines; khr: off in both, `TANDEM_VULKAN_COOPMAT2=0` beside
# `GGML_VK_DISABLE_COOPMAT2=1`, the path AMD and Intel GPUs take) it warms llama.cpp up and runs
# `llama-bench -p 512 -n 128 -fa 1 -ngl 99 -r 3`, then `engine bench --backend vulkan
# --prompt-tokens 512 --gen-tokens 128 --chunk 512` (one warm-up repetition, REPEAT timed), and
# where PROFILE names the shape, `engine bench --profile` (the per-op prefill profile; BEFORE, an
# older engine, is profiled too). $OUT gets every JSON, report.md with the ratios, build.log.
#
# Parameters (environment): SHAPES, PATHS ("cm2 khr"), ENGINE (.bench/new/engine), BEFORE (unset),
# PROFILE (shape:dtype pairs to profile), PEER (.peer), REPEAT (3), WORK (/tmp/pf), OUT,
# PRECISIONS ("exact"; "exact fast" benches tandem once per `--precision`, the report's rows for
# `fast` reading "<path> fast").
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-1b:q4_k"}
PATHS=${PATHS:-"cm2 khr"}
ENGINE=${ENGINE:-.bench/new/engine}
BEFORE=${BEFORE:-}
PROFILE=${PROFILE:-}
PEER=${PEER:-.peer}
REPEAT=${REPEAT:-3}
PRECISIONS=${PRECISIONS:-exact}
WORK=${WORK:-/tmp/pf}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT" "$WORK"

. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
chmod +x "$ENGINE" ${BEFORE:+"$BEFORE"} 2>/dev/null

t0=$(date +%s)
TARGETS="llama-bench" OUTDIR=$OUT bash "$PEER/build-and-bench.sh" >"$OUT/build.log" 2>&1 || { echo "llama.cpp did not build"; tail -20 "$OUT/build.log"; exit 1; }
echo "peer built in $(( $(date +%s) - t0 )) s"
llama=/tmp/lcpp/build/bin/llama-bench
peer_env=(env LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu)

for pair in $SHAPES; do
    IFS=: read -r shape dtype <<<"$pair"
    gguf="$WORK/$shape-$dtype.gguf"
    "$ENGINE" synth --shape "$shape" --dtype "$dtype" --out "$gguf" --force >/dev/null || { echo "synth failed: $pair"; continue; }
    for path in $PATHS; do
        name="$shape-$dtype-$path"
        if [ "$path" = khr ]; then
            lenv=(GGML_VK_DISABLE_COOPMAT2=1); tenv=(TANDEM_VULKAN_COOPMAT2=0)
        else
            lenv=(); tenv=(TANDEM_VULKAN_COOPMAT2=1)
        fi
        "${peer_env[@]}" "${lenv[@]}" "$llama" -m "$gguf" -p 512 -n 32 -fa 1 -ngl 99 -r 1 >/dev/null 2>&1
        "${peer_env[@]}" "${lenv[@]}" "$llama" -m "$gguf" -p 512 -n 128 -fa 1 -ngl 99 -r "$REPEAT" -o json \
            >"$OUT/llamacpp-$name.json" 2>>"$OUT/build.log" || echo "llama-bench failed on $name"
        for prec in $PRECISIONS; do
            tname=$name; [ "$prec" != exact ] && tname="$name@$prec"
            env "${tenv[@]}" timeout 400 "$ENGINE" bench --model "$gguf" --backend vulkan --prompt-tokens 512 \
                --gen-tokens 128 --chunk 512 --repeat "$REPEAT" --precision "$prec" --json >"$OUT/tandem-$tname.json" \
                || echo "engine bench failed on $tname"
        done
        if [[ " $PROFILE " == *" $pair "* ]]; then
            for which in after before; do
                bin=$ENGINE; [ "$which" = before ] && bin=$BEFORE
                [ -z "$bin" ] && continue
                env "${tenv[@]}" "$bin" bench --model "$gguf" --backend vulkan --prompt-tokens 512 --gen-tokens 8 \
                    --chunk 512 --repeat 1 --profile --json >"$OUT/profile-$which-$name.json" 2>/dev/null \
                    || echo "profile ($which) failed on $name"
            done
        fi
        echo "done $name"
    done
    rm -f "$gguf"
done

python3 - "$OUT" <<'PY' | tee "$OUT/report.md"
import glob, json, os, sys
out = sys.argv[1]
gpu = open(f"{out}/gpu.txt").read().strip() if os.path.exists(f"{out}/gpu.txt") else "?"
print(f"GPU: {gpu}\n")
print("| shape | path | prefill 512: tandem / llama.cpp | decode b1: tandem / llama.cpp |")
print("| --- | --- | --- | --- |")
for t in sorted(glob.glob(f"{out}/tandem-*.json")):
    tname = os.path.basename(t)[len("tandem-"):-len(".json")]
    name, _, prec = tname.partition("@")
    shape, path = name.rsplit("-", 1)
    path = f"{path} {prec}" if prec else path
    try:
        r = json.load(open(t))["runs"][0]
        tp, td = r["prefill_tokens_per_s"]["median"], r["decode_tokens_per_s"]["median"]
    except Exception as e:
        print(f"| {shape} | {path} | no tandem result ({e}) | |")
        continue
    lp = ld = None
    try:
        for x in json.load(open(f"{out}/llamacpp-{name}.json")):
            if x["n_prompt"] > 0 and x["n_gen"] == 0:
                lp = x["avg_ts"]
            if x["n_gen"] > 0 and x["n_prompt"] == 0:
                ld = x["avg_ts"]
    except Exception:
        pass
    cell = lambda a, b: f"{a:,.0f} / -" if b is None else f"{a:,.0f} / {b:,.0f} = {a / b:.2f}"
    print(f"| {shape} | {path} | {cell(tp, lp)} | {cell(td, ld)} |")
profiles = sorted(glob.glob(f"{out}/profile-after-*.json"))
for p in profiles:
    name = os.path.basename(p)[len("profile-after-"):-len(".json")]
    rows = {}
    for which in ("before", "after"):
        f = f"{out}/profile-{which}-{name}.json"
        if os.path.exists(f):
            for o in json.load(open(f))["runs"][0]["profile"]["prefill"]:
                rows.setdefault(o["op"], {})[which] = o["seconds"] * 1e3
    print(f"\nPrefill profile, {name} (ms per 512-token step; GPU timestamps per node):\n")
    print("| op | before | after |")
    print("| --- | --- | --- |")
    for op, v in sorted(rows.items(), key=lambda kv: -max(kv[1].values()))[:8]:
        f = lambda x: "-" if x is None else f"{x:.2f}"
        print(f"| {op} | {f(v.get('before'))} | {f(v.get('after'))} |")
PY
# The tool brings back few files: the JSON results in one archive.
tar -czf "$OUT/results.tar.gz" -C "$OUT" $(cd "$OUT" && ls *.json) && rm -f "$OUT"/*.json
