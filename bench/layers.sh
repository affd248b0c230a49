#!/usr/bin/env bash
# bench/layers.sh: layer splits (`--gpu-layers N`, `[placement.layers]`, a memory budget's fit)
# beside llama.cpp's partial offload (`llama-bench -ngl N`), on the GPU machine (the device
# tool's `run`), in one run on the same `engine synth` files.
#
# Expects, carried with the working tree: the stripped release engine and its plugins
# (ENGINE, default .devcarry/engine), .gl/*.deb (the Vulkan loader, see bench/device.sh) and the
# llama.cpp kit in PEER (default .peer: `../shared/peers/prepare-llamacpp-vulkan.sh .peer`).
# It builds llama-bench there first (`$PEER/build-and-bench.sh`, build only; skipped when
# /tmp/lcpp already holds it, as on a machine still warm from an earlier call).
#
# One device command may run 10 minutes, so PARTS chooses the work of a call:
#   1b, 4b (or small, both: likely more than 10 minutes; one call each is safer): q4_k, L layers,
#       N = NGL_1B / NGL_4B (13 of 26, 17 of 34):
#     1. the greedy continuation (16 tokens, --temperature 0) of one prompt on `--backend vulkan`,
#        `--backend vulkan --gpu-layers N` and the vulkan/vulkan#2 layer config (they must agree);
#     2. one warm-up of each engine, then one after the other: llama-bench -ngl N, tandem
#        --gpu-layers N (batch 1), llama-bench -ngl N+1 and -ngl 99, tandem --backend vulkan
#        (batch 1,8), tandem `[placement.layers] vulkan = "0-{N-1}", "vulkan#2" = "{N}-{L-1}"`
#        (batch 1,8), then for each batch B of MB_BATCHES_*: tandem --gpu-layers N at batch B
#        with `[placement] micro_batches = 1` and then 2 (MB_PROMPT_TOKENS/MB_GEN_TOKENS/MB_REPEAT).
#        Every llama-bench run (`-fa 1 -o json`) has a warm-up (`-r 1 -n 16`) before it.
#        llama.cpp's -ngl K puts its last K-1 layers and the output head on the GPU (its
#        embedding stays on the CPU); tandem's --gpu-layers N puts layers 0..N-1, the embedding
#        and the head there: -ngl N+1 holds as many layers as --gpu-layers N, hence that run.
#   27b: gemma3-27b q4_k (62 layers), with `[backend.vulkan] memory_limit = LIMIT_27B` and
#     `--backend auto` (the fit step splits it by layers):
#     1. `engine placement` (its text: $OUT/gemma3-27b-placement.txt); N = the layers on vulkan in
#        its `layers:` line (else the `note:` of step 2, else NGL_27B);
#     2. `engine run` (5 prompt tokens, 16 generated, --context 128): stderr in
#        $OUT/gemma3-27b-run.stderr (the note saying how it was split);
#     3. llama-bench -ngl N, tandem bench (that config, --backend auto), llama-bench -ngl N+1:
#        PROMPT_27B prompt tokens, GEN_27B generated, REPEAT_27B repeats.
#   HOST_BOUNDARIES=1 adds, to parts 1b/4b, the vulkan/vulkan#2 and --gpu-layers N runs again with
#     `[placement] boundaries = "host"` (labels tandem-vv-host, tandem-ngl<N>-host; the greedy
#     check too): device-side boundaries against the host path, in the same call. VV_MB_BATCHES
#     adds vulkan/vulkan#2 runs with `micro_batches = 2` at those batches (tandem-vv-b<B>-mb2).
#   The GGUF of each shape is deleted at the end of its part.
# Every engine and llama-bench call runs under `timeout` (STEP_TIMEOUT, and never past BUDGET_S
# seconds from the start: a step with too little time left is skipped and says so), so the run
# ends with its results even when a step hangs.
#
# Outputs in $OUT (the device tool brings back at most 8 files):
#   results.tar.gz  the JSON results, packed again after every step: <shape>-<label>.json, labels
#                   tandem-ngl13, tandem-vulkan, tandem-vv, tandem-ngl13-b8-mb1, tandem-auto,
#                   llama-ngl13, llama-ngl14, llama-ngl99, ...; <shape>-greedy.json (the ids per
#                   placement) and <shape>-meta.json (L, N, lengths, the command)
#   layers.log      everything the run printed
#   gemma3-27b-placement.txt, gemma3-27b-run.stderr   (part 27b)
# Here: mkdir r && tar -xzf results.tar.gz -C r && python3 bench/layers_report.py r
#
# Parameters (environment):
#   PARTS             1b 4b small 27b, space-separated                 (small)
#   ENGINE            the engine binary                                 (.devcarry/engine)
#   PEER              the llama.cpp kit                                 (.peer)
#   PROMPT_TOKENS, GEN_TOKENS, REPEAT   1b/4b lengths and timed repeats (512, 128, 3)
#   VULKAN_BATCHES    batches of the tandem vulkan and vulkan/vulkan#2 runs (1,8)
#   MB_BATCHES_1B, MB_BATCHES_4B   batches of the micro_batches runs, space-separated
#                                  (8 32; 8); empty: none
#   MB_PROMPT_TOKENS, MB_GEN_TOKENS, MB_REPEAT   their lengths (128, 64, $REPEAT: the CPU half
#                                  prefills every sequence of the batch; 512 at batch 32 takes
#                                  minutes)
#   NGL_1B, NGL_4B    N                                                 (13, 17)
#   LLAMA_PLUS1       1: also llama-bench -ngl N+1                      (1)
#   LLAMA_RUNS        0: no llama.cpp build or runs (tandem only)       (1)
#   HOST_BOUNDARIES   1: also the host-boundary runs (see above)        (0)
#   NO_OFFLOAD        1: also --gpu-layers N without the prefill op offload
#                     (TANDEM_PREFILL_OFFLOAD_ROWS=0; label tandem-ngl<N>-nooffload)  (0)
#   VV_MB_BATCHES     batches of vulkan/vulkan#2 micro_batches=2 runs   (empty: none)
#   PROMPT_27B, GEN_27B, REPEAT_27B, LIMIT_27B   (64, 16, 1, 8GiB)
#   NGL_27B           N when neither the placement nor the note says it (empty)
#   LLAMA_BENCH       the llama-bench binary                            (/tmp/lcpp/build/bin/llama-bench)
#   STEP_TIMEOUT      seconds one engine or llama-bench call may take   (300)
#   BUDGET_S          seconds the whole run may take                    (570)
#   WORK              scratch: GGUF files, configs, JSON before packing (/tmp/tandem-layers)
#   OUT               what comes back (set by the device tool; ./layers-out otherwise)
set -uo pipefail
T0=$(date +%s)
PARTS=${PARTS:-small}
E=${ENGINE:-.devcarry/engine}
PEER=${PEER:-.peer}
P=${PROMPT_TOKENS:-512}
G=${GEN_TOKENS:-128}
R=${REPEAT:-3}
VULKAN_BATCHES=${VULKAN_BATCHES:-1,8}
MB_BATCHES_1B=${MB_BATCHES_1B-"8 32"}
MB_BATCHES_4B=${MB_BATCHES_4B-"8"}
MB_P=${MB_PROMPT_TOKENS:-128}
MB_G=${MB_GEN_TOKENS:-64}
MB_R=${MB_REPEAT:-$R}
NGL_1B=${NGL_1B:-13}
NGL_4B=${NGL_4B:-17}
LLAMA_PLUS1=${LLAMA_PLUS1:-1}
LLAMA_RUNS=${LLAMA_RUNS:-1}
HOST_BOUNDARIES=${HOST_BOUNDARIES:-0}
NO_OFFLOAD=${NO_OFFLOAD:-0}
VV_MB_BATCHES=${VV_MB_BATCHES:-}
P27=${PROMPT_27B:-64}
G27=${GEN_27B:-16}
R27=${REPEAT_27B:-1}
LIMIT_27B=${LIMIT_27B:-8GiB}
NGL_27B=${NGL_27B:-}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
BUDGET_S=${BUDGET_S:-570}
W=${WORK:-/tmp/tandem-layers}
OUT=${OUT:-$PWD/layers-out}
J=$W/json
PARTS=${PARTS//small/1b 4b}
COMMAND="PARTS=\"$PARTS\" PROMPT_TOKENS=$P GEN_TOKENS=$G REPEAT=$R VULKAN_BATCHES=$VULKAN_BATCHES MB_BATCHES_1B=\"$MB_BATCHES_1B\" MB_BATCHES_4B=\"$MB_BATCHES_4B\" MB_PROMPT_TOKENS=$MB_P MB_GEN_TOKENS=$MB_G MB_REPEAT=$MB_R NGL_1B=$NGL_1B NGL_4B=$NGL_4B LLAMA_RUNS=$LLAMA_RUNS HOST_BOUNDARIES=$HOST_BOUNDARIES NO_OFFLOAD=$NO_OFFLOAD VV_MB_BATCHES=\"$VV_MB_BATCHES\" PROMPT_27B=$P27 GEN_27B=$G27 REPEAT_27B=$R27 LIMIT_27B=$LIMIT_27B bash bench/layers.sh"
PROMPT_IDS=2,1000,2000,3000,4000
rm -rf "$J"
mkdir -p "$W" "$J" "$OUT"

# Seconds left of BUDGET_S.
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
# The timeout for the next step (STEP_TIMEOUT, less when the budget is nearly spent); fails
# (prints nothing) when fewer than 20 s are left.
tmo() {
    local l t=$STEP_TIMEOUT
    l=$(($(left) - 10))
    [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 20 ] && echo "$t"
}
# Packs every JSON result so far into $OUT/results.tar.gz (again after every step, so that a run
# cut short still brings back what it measured).
pack() {
    compgen -G "$J/*.json" >/dev/null || return 0
    (cd "$J" && tar -czf "$OUT/.results.tmp" ./*.json && mv "$OUT/.results.tmp" "$OUT/results.tar.gz")
}
# One line per JSON result: tandem's medians per batch, llama-bench's averages per test.
summary() {
    python3 - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"    (unreadable: {e})"); sys.exit()
if isinstance(d, list):
    print("    " + "; ".join(f"pp{r['n_prompt']} tg{r['n_gen']} ngl {r['n_gpu_layers']}: {r['avg_ts']:.1f} tok/s" for r in d))
else:
    for r in d.get("runs", []):
        print(f"    batch {r['batch']}: prefill {r['prefill_tokens_per_s']['median']:.1f}, decode {r['decode_tokens_per_s']['median']:.1f} tok/s")
PY
}
# tandem LABEL [--config FILE] BENCH_ARGS...: `engine bench` on $g into $J/$shape-LABEL.json.
tandem() {
    local label=$1 t s cfg=()
    shift
    if [ "$1" = --config ]; then cfg=(--config "$2"); shift 2; fi
    t=$(tmo) || { echo "== $shape $label: skipped, out of time"; return; }
    echo "== $shape $label: engine ${cfg[*]:+${cfg[*]} }bench $* (timeout $t s)"
    s=$(date +%s)
    timeout -k 10 "$t" "$E" "${cfg[@]}" bench --model "$g" "$@" --out "$J/$shape-$label.json"
    echo "   rc $? in $(($(date +%s) - s)) s"
    [ -s "$J/$shape-$label.json" ] && summary "$J/$shape-$label.json"
    pack
}
# llama LABEL NGL PROMPT GEN REPEAT: a warm-up llama-bench (-r 1 -n 16), then the measured one
# into $J/$shape-LABEL.json.
llama() {
    local label=$1 ngl=$2 p=$3 n=$4 r=$5 t s
    [ -n "$LLAMA" ] || { echo "== $shape $label: skipped, no llama-bench"; return; }
    t=$(tmo) || { echo "== $shape $label: skipped, out of time"; return; }
    echo "== $shape $label: llama-bench -p $p -n $n -fa 1 -ngl $ngl -r $r (warm-up -n 16 -r 1 first; timeout $t s each)"
    s=$(date +%s)
    timeout -k 10 "$t" "${peer_env[@]}" "$LLAMA" -m "$g" -p "$p" -n 16 -fa 1 -ngl "$ngl" -r 1 \
        >/dev/null 2>>"$W/llama.stderr" || echo "   warm-up rc $?"
    t=$(tmo) || { echo "   measured run skipped, out of time"; return; }
    if timeout -k 10 "$t" "${peer_env[@]}" "$LLAMA" -m "$g" -p "$p" -n "$n" -fa 1 -ngl "$ngl" -r "$r" -o json \
        >"$W/llama.json" 2>>"$W/llama.stderr" && [ -s "$W/llama.json" ]; then
        mv "$W/llama.json" "$J/$shape-$label.json"
        echo "   done in $(($(date +%s) - s)) s"
        summary "$J/$shape-$label.json"
    else
        echo "   llama-bench failed (rc $?); its stderr ends:"
        tail -5 "$W/llama.stderr" | sed 's/^/   | /'
    fi
    pack
}
# greedy NAME [--config FILE] RUN_ARGS...: the greedy ids of the fixed prompt, printed and kept
# in $W/greedy.tsv.
greedy() {
    local name=$1 t ids cfg=()
    shift
    if [ "$1" = --config ]; then cfg=(--config "$2"); shift 2; fi
    t=$(tmo) || { echo "$name: skipped, out of time"; return; }
    ids=$(timeout -k 10 "$t" "$E" "${cfg[@]}" run --model "$g" "$@" --tokens "$PROMPT_IDS" --max-tokens 16 \
        --temperature 0 --context 64 --json 2>"$W/run.stderr" |
        python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["tokens"]))' 2>/dev/null) || ids=null
    printf '%-34s %s\n' "$name" "$ids"
    sed 's/^/   | /' "$W/run.stderr"
    printf '%s\t%s\n' "$name" "$ids" >>"$W/greedy.tsv"
}
# meta KEY=VALUE...: writes $J/$shape-meta.json (numbers stay numbers).
meta() {
    python3 - "$J/$shape-meta.json" "$@" <<'PY'
import json, sys
doc = {}
for kv in sys.argv[2:]:
    k, _, v = kv.partition("=")
    try:
        doc[k] = json.loads(v)
    except ValueError:
        doc[k] = v
json.dump(doc, open(sys.argv[1], "w"), indent=1)
PY
}
# synth SHAPE: the q4_k GGUF in $g (kept from an earlier call on a warm machine).
synth() {
    g=$W/$1-q4_k.gguf
    [ -s "$g" ] && { echo "== $1: reusing $g"; return 0; }
    local s
    s=$(date +%s)
    "$E" synth --shape "$1" --dtype q4_k --out "$g.part" --force >/dev/null && mv "$g.part" "$g" ||
        { rm -f "$g.part"; echo "== $1: synth failed"; return 1; }
    echo "== $1: synth in $(($(date +%s) - s)) s, $(du -h "$g" | cut -f1)"
}

# Part 1b / 4b: SHAPE L N MB_BATCHES.
small() {
    shape=$1
    local L=$2 N=$3 mbs=$4 b m t vv n1=$(($3 + 1))
    echo "==== part $shape: $L layers, N = $N, $(left) s left"
    synth "$shape" || return
    vv=$W/vv-$shape.toml
    printf '[placement.layers]\nvulkan = "0-%d"\n"vulkan#2" = "%d-%d"\n' $((N - 1)) "$N" $((L - 1)) >"$vv"
    meta shape="$shape" layers="$L" gpu_layers="$N" prompt_tokens="$P" gen_tokens="$G" repeat="$R" \
        mb_prompt_tokens="$MB_P" mb_gen_tokens="$MB_G" mb_repeat="$MB_R" \
        mb_batches="[$(echo $mbs | tr ' ' ',')]" vv_config="$(tr '\n' ' ' <"$vv")" command="$COMMAND"

    echo "== $shape greedy ids of $PROMPT_IDS"
    : >"$W/greedy.tsv"
    greedy "vulkan" --backend vulkan
    greedy "vulkan --gpu-layers $N" --backend vulkan --gpu-layers "$N"
    greedy "vulkan+vulkan#2 layers" --config "$vv" --backend auto
    if [ "$HOST_BOUNDARIES" = 1 ]; then
        vvh=$W/vvh-$shape.toml
        printf '[placement]\nboundaries = "host"\n' | cat - "$vv" >"$vvh"
        printf '[placement]\nboundaries = "host"\n' >"$W/host.toml"
        greedy "vulkan+vulkan#2 layers, host boundaries" --config "$vvh" --backend auto
    fi
    python3 - "$W/greedy.tsv" >"$J/$shape-greedy.json" <<'PY'
import json, sys
ids = {}
for line in open(sys.argv[1]):
    name, _, v = line.rstrip("\n").partition("\t")
    ids[name] = json.loads(v)
print(json.dumps({"prompt": [2, 1000, 2000, 3000, 4000], "tokens": ids}, indent=1))
PY
    python3 -c 'import json,sys; t=[v for v in json.load(open(sys.argv[1]))["tokens"].values()]; print("greedy:", "all agree" if t and None not in t and all(x == t[0] for x in t) else "DIFFER (or failed)")' "$J/$shape-greedy.json"
    pack

    echo "== $shape warm-ups"
    t=$(tmo) && timeout -k 10 "$t" "$E" bench --model "$g" --backend vulkan --prompt-tokens 64 --gen-tokens 16 \
        --batch 1 --repeat 1 >/dev/null || echo "   tandem warm-up failed"
    if [ -n "$LLAMA" ] && t=$(tmo); then
        timeout -k 10 "$t" "${peer_env[@]}" "$LLAMA" -m "$g" -p "$P" -n 16 -fa 1 -ngl 99 -r 1 \
            >/dev/null 2>>"$W/llama.stderr" || echo "   llama.cpp warm-up failed"
    fi

    llama "llama-ngl$N" "$N" "$P" "$G" "$R"
    tandem "tandem-ngl$N" --backend vulkan --gpu-layers "$N" --prompt-tokens "$P" --gen-tokens "$G" --batch 1 --repeat "$R"
    if [ "$NO_OFFLOAD" = 1 ]; then
        TANDEM_PREFILL_OFFLOAD_ROWS=0 tandem "tandem-ngl$N-nooffload" --backend vulkan --gpu-layers "$N" \
            --prompt-tokens "$P" --gen-tokens "$G" --batch 1 --repeat "$R"
    fi
    [ "$LLAMA_PLUS1" = 1 ] && llama "llama-ngl$n1" "$n1" "$P" "$G" "$R"
    llama "llama-ngl99" 99 "$P" "$G" "$R"
    tandem "tandem-vulkan" --backend vulkan --prompt-tokens "$P" --gen-tokens "$G" --batch "$VULKAN_BATCHES" --repeat "$R"
    tandem "tandem-vv" --config "$vv" --backend auto --prompt-tokens "$P" --gen-tokens "$G" --batch "$VULKAN_BATCHES" --repeat "$R"
    if [ "$HOST_BOUNDARIES" = 1 ]; then
        tandem "tandem-vv-host" --config "$vvh" --backend auto --prompt-tokens "$P" --gen-tokens "$G" --batch "$VULKAN_BATCHES" --repeat "$R"
        tandem "tandem-ngl$N-host" --config "$W/host.toml" --backend vulkan --gpu-layers "$N" --prompt-tokens "$P" --gen-tokens "$G" --batch 1 --repeat "$R"
    fi
    for b in $VV_MB_BATCHES; do
        printf '[placement]\nmicro_batches = 2\n' | cat - "$vv" >"$W/vv-mb2.toml"
        tandem "tandem-vv-b$b-mb2" --config "$W/vv-mb2.toml" --backend auto --prompt-tokens "$MB_P" --gen-tokens "$MB_G" --batch "$b" --repeat "$MB_R"
    done
    for b in $mbs; do
        for m in 1 2; do
            printf '[placement]\nmicro_batches = %d\n' "$m" >"$W/mb$m.toml"
            tandem "tandem-ngl$N-b$b-mb$m" --config "$W/mb$m.toml" --backend vulkan --gpu-layers "$N" \
                --prompt-tokens "$MB_P" --gen-tokens "$MB_G" --batch "$b" --repeat "$MB_R"
        done
    done
    rm -f "$g"
    echo "==== part $shape done, $(left) s left"
}

# Part 27b.
big() {
    shape=gemma3-27b
    local L=62 N t lim=$W/limit.toml ctx=$((P27 + G27 + 1)) layers_line note
    echo "==== part $shape: memory_limit $LIMIT_27B, $(left) s left"
    synth "$shape" || return
    printf '[backend.vulkan]\nmemory_limit = "%s"\n' "$LIMIT_27B" >"$lim"

    # The context of `engine bench` (prompt + generated + 1), so that the fit (whose KV cache
    # grows with the context) is the one the bench gets.
    echo "== $shape placement (--backend auto, --context $ctx)"
    t=$(tmo) && timeout -k 10 "$t" "$E" --config "$lim" placement --model "$g" --backend auto --context "$ctx" \
        >"$OUT/$shape-placement.txt" 2>&1 || echo "   engine placement failed (rc $?)"
    grep -E '^(layers:|note:|placement from)|memory:' "$OUT/$shape-placement.txt" | sed 's/^/   | /'
    layers_line=$(grep -m1 '^layers:' "$OUT/$shape-placement.txt")
    N=$(python3 - "$layers_line" <<'PY'
import re, sys
# layers: vulkan: layers 0-24, embedding, head; cpu: layers 25-61
n = 0
for part in sys.argv[1].partition(":")[2].split(";"):
    unit, _, what = part.strip().partition(": ")
    m = re.search(r"layers ([0-9,\- ]+)", what)
    if unit == "vulkan" and m:
        for r in m.group(1).split(","):
            if r.strip():
                a, _, b = r.strip().partition("-")
                n += int(b or a) - int(a) + 1
print(n or "")
PY
)

    # The same context as the placement and the bench, so that auto's cached measurement of
    # the same candidates answers (a 27B candidate loads 15 GiB; session 17's call spent its
    # time measuring again at --context 128, which fits two more layers).
    echo "== $shape run (--backend auto, --context $ctx)"
    t=$(tmo) && timeout -k 10 "$t" "$E" --config "$lim" run --model "$g" --backend auto --tokens "$PROMPT_IDS" \
        --max-tokens 16 --temperature 0 --context "$ctx" --json >"$W/run27.json" 2>"$OUT/$shape-run.stderr" ||
        echo "   engine run failed (rc $?)"
    sed 's/^/   | /' "$OUT/$shape-run.stderr"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("   tokens", d["tokens"], "decode %.1f tok/s" % d["decode_tokens_per_second"])' \
        "$W/run27.json" 2>/dev/null
    note=$(grep -m1 'layers fit there' "$OUT/$shape-run.stderr")
    if [ -z "$N" ]; then
        N=$(sed -nE 's/.* ([0-9]+) of [0-9]+ layers fit there.*/\1/p' <<<"$note")
        N=${N:-$NGL_27B}
    fi
    echo "== $shape: N = ${N:-unknown} of $L layers on vulkan"
    meta shape="$shape" layers="$L" gpu_layers="${N:-null}" memory_limit="$LIMIT_27B" prompt_tokens="$P27" \
        gen_tokens="$G27" repeat="$R27" placement_context="$ctx" layers_line="$layers_line" note="$note" \
        command="$COMMAND"
    pack

    if [ -n "$N" ]; then
        llama "llama-ngl$N" "$N" "$P27" "$G27" "$R27"
    else
        echo "== $shape: no N, no llama-bench runs"
    fi
    tandem "tandem-auto" --config "$lim" --backend auto --prompt-tokens "$P27" --gen-tokens "$G27" --batch 1 --repeat "$R27"
    [ -n "$N" ] && [ "$LLAMA_PLUS1" = 1 ] && llama "llama-ngl$((N + 1))" $((N + 1)) "$P27" "$G27" "$R27"
    rm -f "$g"
    echo "==== part $shape done, $(left) s left"
}

{
echo "$COMMAND"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
chmod +x "$E" 2>/dev/null
"$E" --version
"$E" backends

# llama.cpp's llama-bench (build only); without it the tandem runs still go on.
s=$(date +%s)
LLAMA=${LLAMA_BENCH:-/tmp/lcpp/build/bin/llama-bench}
if [ "$LLAMA_RUNS" != 1 ]; then
    echo "LLAMA_RUNS=$LLAMA_RUNS: tandem only"
    LLAMA=
elif OUTDIR=$W/peer TARGETS=llama-bench MODELS="" bash "$PEER/build-and-bench.sh"; then
    echo "llama-bench ready in $(($(date +%s) - s)) s"
else
    echo "llama.cpp did not build ($W/peer/build.log): tandem only"
    LLAMA=
fi
# The peer's Vulkan loader, for llama-bench only (tandem uses the one from .gl).
peer_env=(env LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu)

for part in $PARTS; do
    case $part in
        1b) small gemma3-1b 26 "$NGL_1B" "$MB_BATCHES_1B" ;;
        4b) small gemma3-4b 34 "$NGL_4B" "$MB_BATCHES_4B" ;;
        27b) big ;;
        *) echo "unknown part '$part' (1b, 4b, small, 27b)" ;;
    esac
done
pack
rm -f "$OUT/.results.tmp"
echo "done in $(($(date +%s) - T0)) s; results.tar.gz holds:"
tar -tzf "$OUT/results.tar.gz" 2>/dev/null | sed 's/^/  /'
} 2>&1 | tee "$OUT/layers.log"
