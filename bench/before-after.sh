#!/usr/bin/env bash
# bench/before-after.sh: two builds of tandem side by side in one device run (issue 52's "no speed
# figure may drop"): `engine bench` prefill and decode tokens/s of BEFORE and AFTER on the same
# `engine synth` files, on the Vulkan backend's default path (coopmat2 on NVIDIA), its KHR path
# (TANDEM_VULKAN_COOPMAT2=0) and a layer split (--gpu-layers), each ratio written as
# `after / before = r`. The two builds run alternately (ABBA per file) so drift falls on both.
#
# Here, first: each build's stripped release binaries in its own folder, each engine beside its
# own plugins (the loader looks next to the binary first, and the two may speak different ABIs):
#   .bench/before/{engine,libtandem_backend_vulkan.so,libtandem_backend_cpu.so}
#   .bench/after/{engine,libtandem_backend_vulkan.so,libtandem_backend_cpu.so}
# and the Vulkan loader debs in .gl/ (see bench/device.sh).
# There (the device tool's `run`, carrying .bench .gl):
#   bash bench/before-after.sh
# $OUT gets json.tar.gz (json/: one `engine bench --json` file per build, file and path, packed
# since the device tool brings back at most 8 files), report.md (the ratio table) and
# before-after.log.
#
# Parameters (environment):
#   FILES          shape:dtype pairs            ("gemma3-1b:q4_k gemma3-4b:q4_k gemma3-4b:f16")
#   KHR_FILES      files also run on the KHR path ("gemma3-1b:q4_k gemma3-4b:q4_k")
#   SPLIT          shape:dtype:layers for a --gpu-layers run ("gemma3-1b:q4_k:13"; empty: none)
#   BATCHES        (1,8)
#   PROMPT_TOKENS  (512)
#   GEN_TOKENS     (128)
#   REPEAT         (2: timed repeats after one warm-up)
#   STEP_TIMEOUT   (150 seconds per bench run)
#   OUT            (set by the device tool; ./before-after-out otherwise)
set -uo pipefail
FILES=${FILES:-"gemma3-1b:q4_k gemma3-4b:q4_k gemma3-4b:f16"}
KHR_FILES=${KHR_FILES:-"gemma3-1b:q4_k gemma3-4b:q4_k"}
SPLIT=${SPLIT-"gemma3-1b:q4_k:13"}
BATCHES=${BATCHES:-1,8}
P=${PROMPT_TOKENS:-512}
G=${GEN_TOKENS:-128}
R=${REPEAT:-2}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
OUT=${OUT:-$PWD/before-after-out}
W=/tmp/tandem-before-after
mkdir -p "$OUT/json" "$W"
unset TANDEM_PLUGIN_PATH

main() {
echo "FILES=\"$FILES\" KHR_FILES=\"$KHR_FILES\" SPLIT=\"$SPLIT\" BATCHES=$BATCHES PROMPT_TOKENS=$P GEN_TOKENS=$G REPEAT=$R bash bench/before-after.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
for b in before after; do
    chmod +x ".bench/$b/engine" 2>/dev/null
    [ -x ".bench/$b/engine" ] || { echo "error: .bench/$b/engine is missing (see the header)"; return 2; }
    echo "== $b"; ".bench/$b/engine" backends | grep -E "vulkan|cpu" | head -4
done
failures=()
# bench BUILD LABEL GGUF [FLAGS...] [-- ENV=VALUE...]: one `engine bench` run into json/BUILD-LABEL.json.
bench() {
    local build=$1 label=$2 gguf=$3
    shift 3
    local flags=() envs=()
    while [ $# -gt 0 ]; do
        if [ "$1" = -- ]; then shift; envs=("$@"); break; fi
        flags+=("$1"); shift
    done
    echo "== $build $label"
    if env "${envs[@]}" timeout "$STEP_TIMEOUT" ".bench/$build/engine" bench --model "$gguf" --backend vulkan \
        --prompt-tokens "$P" --gen-tokens "$G" --repeat "$R" --json "${flags[@]}" \
        >"$OUT/json/$build-$label.json.part"; then
        mv "$OUT/json/$build-$label.json.part" "$OUT/json/$build-$label.json"
    else
        failures+=("$build $label (exit $?)")
        rm -f "$OUT/json/$build-$label.json.part"
    fi
}
# abba LABEL GGUF ARGS...: before, after, after, before (the second pair as LABEL_r2).
abba() {
    local label=$1
    shift
    bench before "$label" "$@"
    bench after "$label" "$@"
    bench after "$label"_r2 "$@"
    bench before "$label"_r2 "$@"
}
synth() {
    local gguf=$W/$1-$2.gguf
    if [ ! -s "$gguf" ]; then
        ".bench/after/engine" synth --shape "$1" --dtype "$2" --out "$gguf" >/dev/null ||
            { failures+=("synth $1 $2"); rm -f "$gguf"; return 1; }
    fi
    echo "$gguf"
}
for f in $FILES; do
    shape=${f%%:*}; dtype=${f#*:}
    gguf=$(synth "$shape" "$dtype") || continue
    abba "$shape-$dtype" "$gguf" --batch "$BATCHES"
    case " $KHR_FILES " in
        *" $f "*) abba "$shape-$dtype-khr" "$gguf" --batch "$BATCHES" -- TANDEM_VULKAN_COOPMAT2=0 ;;
    esac
done
if [ -n "$SPLIT" ]; then
    shape=${SPLIT%%:*}; rest=${SPLIT#*:}; dtype=${rest%%:*}; layers=${rest#*:}
    gguf=$(synth "$shape" "$dtype") && abba "$shape-$dtype-ngl$layers" "$gguf" --batch 1 --gpu-layers "$layers"
fi
rm -f "$W"/*.gguf

# The ratio table: per file and path, the median over both pairs of each build's medians.
python3 - "$OUT/json" "$OUT/report.md" <<'PY'
import json, os, sys, statistics
src, dst = sys.argv[1], sys.argv[2]
res = {}
for f in sorted(os.listdir(src)):
    if not f.endswith(".json"):
        continue
    build, label = f[:-5].split("-", 1)
    label = label.split("_r2")[0]
    doc = json.load(open(os.path.join(src, f)))
    for run in doc.get("runs", []):
        for what in ("prefill", "decode"):
            key = (label, run["batch"], what)
            res.setdefault(key, {}).setdefault(build, []).append(run[f"{what}_tokens_per_s"]["median"])
lines = ["# after / before (median tokens/s, each the median of both ABBA pairs)", "",
         "| file and path | batch | phase | after / before = r |", "| --- | --- | --- | --- |"]
for (label, batch, what), v in sorted(res.items()):
    if what == "prefill" and batch != 1:
        continue
    a, b = v.get("after"), v.get("before")
    if not a or not b:
        cell = "-"
    else:
        a, b = statistics.median(a), statistics.median(b)
        cell = f"{a:,.1f} / {b:,.1f} = {a / b:.3f}"
    lines.append(f"| {label} | {batch} | {what} | {cell} |")
open(dst, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
# The device tool brings back at most 8 files: the JSON results travel as one archive.
tar -czf "$OUT/json.tar.gz" -C "$OUT" json && rm -rf "$OUT/json"
if [ ${#failures[@]} -gt 0 ]; then
    echo "== failed"; printf '  %s\n' "${failures[@]}"; return 1
fi
echo "== done"
}
main 2>&1 | tee "$OUT/before-after.log"
exit "${PIPESTATUS[0]}"
