#!/usr/bin/env bash
# bench/wgpu-vs-vulkan.sh: the wgpu backend beside the Vulkan backend (issue 33's measurement), in
# one device run on the same `engine synth` files: prefill and decode tokens/s of both backends
# for every shape, weight format and batch size, each ratio written as `wgpu / vulkan = r`, then a
# per-op profile of one decode and one prefill step on both backends.
#
# Here, first: a release build stripped into .devcarry/ (engine, libtandem_backend_vulkan.so,
# libtandem_backend_wgpu.so, libtandem_backend_cpu.so), and the Vulkan loader debs in .gl/ (see
# bench/device.sh):
#   cargo build --release -p tandem-cli -p tandem-backend-vulkan -p tandem-backend-wgpu -p tandem-backend-cpu
#   mkdir -p .devcarry && cp target/release/engine target/release/libtandem_backend_{vulkan,wgpu,cpu}.so .devcarry/
#   strip .devcarry/*
# There (the device tool's `run`, carrying .devcarry .gl):
#   bash bench/wgpu-vs-vulkan.sh
# $OUT gets json/ (one `engine bench --json` file per backend, shape and format), report.md (the
# ratio table), profile/ (per-op profiles, `engine bench --profile`, and the dispatch counts the
# wgpu backend prints with `profile` on) and wgpu-vs-vulkan.log.
#
# Parameters (environment):
#   SHAPES         ("gemma3-1b gemma3-4b")
#   DTYPES         ("q4_k f16")
#   BATCHES        ("1,8")
#   PROMPT_TOKENS  (512)
#   GEN_TOKENS     (128)
#   REPEAT         (2: timed repeats after one warm-up)
#   WGPU_FEATURES  (empty: the variants the adapter offers; `portable` forces the portable
#                   kernels; "auto portable" runs wgpu twice, the second as backend wgpu(portable))
#   PROFILE        (1: the per-op profile of 1B q4_k; 0: none)
#   STEP_TIMEOUT   (150 seconds per bench run)
#   ENGINE         (.devcarry/engine)
#   OUT            (set by the device tool; ./wgpu-vs-vulkan-out otherwise)
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-1b gemma3-4b"}
DTYPES=${DTYPES:-"q4_k f16"}
BATCHES=${BATCHES:-1,8}
P=${PROMPT_TOKENS:-512}
G=${GEN_TOKENS:-128}
R=${REPEAT:-2}
WGPU_FEATURES=${WGPU_FEATURES:-auto}
PROFILE=${PROFILE:-1}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
ENGINE=${ENGINE:-.devcarry/engine}
OUT=${OUT:-$PWD/wgpu-vs-vulkan-out}
W=/tmp/tandem-wgpu-vs-vulkan
mkdir -p "$OUT/json" "$OUT/profile" "$W"
export TANDEM_PLUGIN_PATH=${TANDEM_PLUGIN_PATH:-$(dirname "$ENGINE")}

main() {
echo "SHAPES=\"$SHAPES\" DTYPES=\"$DTYPES\" BATCHES=$BATCHES PROMPT_TOKENS=$P GEN_TOKENS=$G REPEAT=$R WGPU_FEATURES=\"$WGPU_FEATURES\" bash bench/wgpu-vs-vulkan.sh"
git log -1 --format='commit %H %s' 2>/dev/null || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
chmod +x "$ENGINE" 2>/dev/null
if [ ! -x "$ENGINE" ]; then
    echo "error: $ENGINE is missing (see the header: a stripped release build in .devcarry/)"
    return 2
fi
"$ENGINE" backends
failures=()
# bench LABEL GGUF BACKEND [ENV=VALUE ...]: one `engine bench` run into json/LABEL.json.
bench() {
    local label=$1 gguf=$2 backend=$3
    shift 3
    echo "== $label"
    if env "$@" timeout "$STEP_TIMEOUT" "$ENGINE" bench --model "$gguf" --backend "$backend" \
        --prompt-tokens "$P" --gen-tokens "$G" --batch "$BATCHES" --repeat "$R" --json \
        >"$OUT/json/$label.json.part"; then
        mv "$OUT/json/$label.json.part" "$OUT/json/$label.json"
    else
        failures+=("$label (exit $?)")
        rm -f "$OUT/json/$label.json.part"
    fi
}
for shape in $SHAPES; do
    for dtype in $DTYPES; do
        gguf=$W/$shape-$dtype.gguf
        if [ ! -s "$gguf" ]; then
            "$ENGINE" synth --shape "$shape" --dtype "$dtype" --out "$gguf" >/dev/null ||
                { failures+=("synth $shape $dtype"); rm -f "$gguf"; continue; }
        fi
        bench "vulkan-$shape-$dtype" "$gguf" vulkan
        for f in $WGPU_FEATURES; do
            if [ "$f" = auto ]; then
                bench "wgpu-$shape-$dtype" "$gguf" wgpu
            else
                bench "wgpu($f)-$shape-$dtype" "$gguf" wgpu "TANDEM_WGPU_FEATURES=$f"
            fi
        done
        # The profile on the first shape's q4_k file, before it goes.
        if [ "$PROFILE" = 1 ] && [ "$dtype" = q4_k ] && [ ! -s "$OUT/profile/profile-$shape-q4_k-wgpu.json" ]; then
            for backend in vulkan wgpu; do
                echo "== profile $backend $shape q4_k"
                timeout "$STEP_TIMEOUT" "$ENGINE" bench --model "$gguf" --backend "$backend" --profile \
                    --prompt-tokens "$P" --gen-tokens 32 --batch 1 --repeat 1 --json \
                    >"$OUT/profile/profile-$shape-q4_k-$backend.json" \
                    2>"$OUT/profile/profile-$shape-q4_k-$backend.stderr" ||
                    failures+=("profile $backend $shape (exit $?)")
                # wgpu says how many dispatches each program has (decode: 1 row).
                grep -h "dispatches" "$OUT/profile/profile-$shape-q4_k-$backend.stderr" | sort -u | head -20
            done
        fi
    done
    rm -f "$W/$shape"-*.gguf
done

# The ratio table: median tokens/s, `wgpu / vulkan = r` per cell.
python3 - "$OUT/json" "$OUT/report.md" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
res = {}
for f in sorted(os.listdir(src)):
    if not f.endswith(".json"):
        continue
    label = f[:-5]
    backend, rest = label.split("-", 1)
    doc = json.load(open(os.path.join(src, f)))
    for run in doc.get("runs", []):
        res[(backend, rest, run["batch"])] = (
            run["prefill_tokens_per_s"]["median"], run["decode_tokens_per_s"]["median"])
shapes = sorted({k[1] for k in res})
batches = sorted({k[2] for k in res})
wgpus = sorted({k[0] for k in res if k[0] != "vulkan"})
def cell(w, v):
    if w is None or v is None:
        return "-"
    return f"{w:,.1f} / {v:,.1f} = {w / v:.2f}"
lines = ["# wgpu beside Vulkan (median tokens/s)", ""]
for wb in wgpus:
    head = ["shape", "prefill (batch 1)"] + [f"decode batch {b}" for b in batches]
    lines += [f"## {wb} / vulkan", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in shapes:
        row = [s]
        w = res.get((wb, s, batches[0])); v = res.get(("vulkan", s, batches[0]))
        row.append(cell(w and w[0], v and v[0]))
        for b in batches:
            w = res.get((wb, s, b)); v = res.get(("vulkan", s, b))
            row.append(cell(w and w[1], v and v[1]))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
lines.append("Each cell: `wgpu / vulkan = r`; the aim is r >= 0.8 for decode and >= 0.5 for prefill, the bar >= 0.7 for decode at batch 1 and >= 0.4 for prefill.")
open(dst, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
# Per-op summary of the profiles: time per op kind in one decode step, both backends.
if compgen -G "$OUT/profile/*.json" >/dev/null; then
    python3 - "$OUT/profile" <<'PY' | tee "$OUT/profile/summary.md"
import json, os, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if not f.endswith(".json"):
        continue
    try:
        doc = json.load(open(os.path.join(d, f)))
    except Exception as e:
        print(f"{f}: unreadable ({e})"); continue
    for run in doc.get("runs", []):
        prof = run.get("profile") or {}
        for phase in ("decode", "prefill"):
            ops = prof.get(phase)
            if not ops:
                continue
            print(f"\n{f} {phase}:\n")
            print(json.dumps(ops, indent=1)[:3000])
PY
fi
if [ ${#failures[@]} -gt 0 ]; then
    echo "== failed"; printf '  %s\n' "${failures[@]}"; return 1
fi
echo "== done"
}
main 2>&1 | tee "$OUT/wgpu-vs-vulkan.log"
exit "${PIPESTATUS[0]}"
