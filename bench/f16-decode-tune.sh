#!/usr/bin/env bash
# bench/f16-decode-tune.sh: one device call for issue 54's 4B f16 decode cell. bench/decode-probe.sh
# runs `matvec_f16`'s shapes on tandem alone (VARIANTS: `TANDEM_VULKAN_MATVEC_COLS` rows per workgroup, `TANDEM_VULKAN_MATVEC_U` slots
# per loop trip); the variant with the best decode median (the default unless one beats it by
# 1%) then runs side by side with llama.cpp through bench/prefill-vs-llamacpp.sh (its
# environment passed through), on both cooperative-matrix paths.
# There (carrying the build, .gl, .peer): BUILD=.bench/nrm bash bench/f16-decode-tune.sh
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}; BUILD=${BUILD:-.bench/nrm}; CELL=${CELL:-gemma3-4b:f16}
VARIANTS=${VARIANTS:-"base c4u1:TANDEM_VULKAN_MATVEC_COLS=4,TANDEM_VULKAN_MATVEC_U=1 c4u4:TANDEM_VULKAN_MATVEC_COLS=4,TANDEM_VULKAN_MATVEC_U=4 c8u1:TANDEM_VULKAN_MATVEC_COLS=8,TANDEM_VULKAN_MATVEC_U=1 c8u4:TANDEM_VULKAN_MATVEC_COLS=8,TANDEM_VULKAN_MATVEC_U=4 c16u1:TANDEM_VULKAN_MATVEC_COLS=16 c16u2:TANDEM_VULKAN_MATVEC_COLS=16,TANDEM_VULKAN_MATVEC_U=2 base2"}
mkdir -p "$OUT/probe"
here=$(dirname "${BASH_SOURCE[0]}")
# (A background build of llama.cpp here died at once on the H200, 2026-11-29: the peer kit's
# `glslc --version | head -1` under pipefail. prefill-vs-llamacpp.sh builds it, ~110 s.)
CELLS=$CELL BUILDS=$BUILD VARIANTS=$VARIANTS GEN=${GEN:-96} OUT=$OUT/probe bash "$here/decode-probe.sh" | tee "$OUT/probe/summary.txt"
best=$(python3 - "$OUT/probe" "$VARIANTS" <<'PY'
import glob, json, os, sys
out, variants = sys.argv[1], sys.argv[2].split()
env = {v.split(":", 1)[0]: (v.split(":", 1)[1] if ":" in v else "") for v in variants}
rate = {}
for f in glob.glob(f"{out}/b-*.json"):
    name = os.path.basename(f)[:-len("-1.json")].rsplit("-", 1)[-1]
    try:
        rate[name] = json.load(open(f))["runs"][0]["decode_tokens_per_s"]["median"]
    except Exception:
        pass
base = max(rate.get("base", 0), rate.get("base2", 0))
name = max(rate, key=rate.get) if rate else "base"
if name == "base2" or rate.get(name, 0) < 1.01 * base:
    name = "base"
print(name, env.get(name, ""))
PY
)
echo "best: $best" | tee -a "$OUT/probe/summary.txt"
read -r _ envs <<<"$best"
IFS=, read -ra kv <<<"$envs"
env "${kv[@]}" SHAPES=$CELL PATHS="khr cm2" ENGINE=$BUILD/engine REPEAT=2 OUT=$OUT/side bash "$here/prefill-vs-llamacpp.sh"
