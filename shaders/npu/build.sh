#!/usr/bin/env bash
# shaders/npu/build.sh - build tandem's NPU attention artefacts (ABI v1).
#
# NOT RUN HERE: the AIE toolchain was not available where this was written.
# See README.md for the toolchain to install and what is unverified.
#
# Usage:
#   PEANO_INSTALL_DIR=/path/to/llvm-aie ./build.sh --generation npu4 \
#       [--out DIR] [--max-context 32768] [--shapes "256:4 256:2 128:2"]
#
# For every shape (head_dim:group) x {decode, prefill} it builds
#   attn_<phase>_d<head_dim>_g<group>.xclbin and .insts.bin
# into DIR (default: build/npu/<generation>) and writes DIR/manifest.json.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
generation=npu4
out=""
max_context=32768
# Gemma 3: 270M/1B d256 g4; 4B/12B d256 g2; 27B d128 g2.
shapes="256:4 256:2 128:2"

die() { echo "build.sh: error: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --generation) generation="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --max-context) max_context="${2:?}"; shift 2 ;;
    --shapes) shapes="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done

case "$generation" in
  npu1) target=aie2-none-unknown-elf ;;
  npu4) target=aie2p-none-unknown-elf ;;
  npu5|npu6) die "generation $generation: no design yet (npu5/npu6 are AIE2P too, but untested device models)" ;;
  *) die "generation must be npu1 or npu4" ;;
esac
[[ -n "$out" ]] || out="build/npu/$generation"

# ---- tool checks ------------------------------------------------------------
python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || die "python3 not found (set PYTHON)"
"$python" -c 'import aie.iron, aie.helpers.taplib' 2>/dev/null \
  || die "mlir-aie / IRON python package not importable: pip install mlir_aie (see README.md)"
"$python" -c 'import numpy, ml_dtypes' 2>/dev/null \
  || die "python packages numpy and ml_dtypes are required"
[[ -n "${PEANO_INSTALL_DIR:-}" ]] || die "PEANO_INSTALL_DIR is not set (llvm-aie install, see README.md)"
clangxx="$PEANO_INSTALL_DIR/bin/clang++"
[[ -x "$clangxx" ]] || die "Peano clang++ not found at $clangxx"
aiecc="${AIECC:-$(command -v aiecc.py || command -v aiecc || true)}"
[[ -n "$aiecc" ]] || die "aiecc.py not found on PATH (comes with the mlir_aie wheel)"
mlir_aie_dir="${MLIR_AIE_DIR:-$("$python" -c 'from aie.utils.config import root_path; print(root_path())' 2>/dev/null || true)}"
[[ -n "$mlir_aie_dir" && -d "$mlir_aie_dir/include" ]] \
  || die "cannot locate the mlir-aie install (aie_api headers); set MLIR_AIE_DIR"

mlir_aie_version="$("$python" -c 'import importlib.metadata as m; print(m.version("mlir_aie"))' 2>/dev/null || echo unknown)"
peano_version="$("$clangxx" --version 2>/dev/null | head -n1 || echo unknown)"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$out/work"
mkdir -p "$work"

# Flags as mlir-aie's programming_examples/makefile-common (PEANOWRAP2*_FLAGS).
cxxflags=(-O2 -std=c++20 "--target=$target" -DNDEBUG -ffp-contract=off
          -Wno-parentheses -Wno-attributes -Wno-macro-redefined -Wno-empty-body
          -I "$mlir_aie_dir/include")
# aiecc: Peano only (no Chess, no xbridge), xclbin + NPU instruction stream.
# Extra flags (e.g. --alloc-scheme=basic-sequential) via AIECC_EXTRA_FLAGS.
read -r -a aiecc_extra <<< "${AIECC_EXTRA_FLAGS:-}"

entries=()
for shape in $shapes; do
  d="${shape%%:*}"; g="${shape##*:}"
  for phase in decode prefill; do
    name="attn_${phase}_d${d}_g${g}"
    echo "== $name ($generation)"
    design_args=(--generation "$generation" --phase "$phase" --head-dim "$d"
                 --group "$g" --max-context "$max_context" --cache-dtype bf16)
    read -r -a defs <<< "$("$python" "$here/designs/attention.py" "${design_args[@]}" --print-config)"
    ( cd "$work" && "$clangxx" "${cxxflags[@]}" "${defs[@]}" \
        -c "$here/kernels/attention.cc" -o "$name.o" ) \
      || die "kernel compile failed for $name"
    "$python" "$here/designs/attention.py" "${design_args[@]}" \
        --kernel-object "$name.o" -o "$work/$name.mlir" \
      || die "design generation failed for $name"
    ( cd "$work" && "$aiecc" --no-aiesim --no-xchesscc --no-xbridge \
        --peano "$PEANO_INSTALL_DIR" --no-compile-host \
        --aie-generate-xclbin --xclbin-name="$name.xclbin" \
        --xclbin-kernel-name=MLIR_AIE \
        --aie-generate-npu-insts --npu-insts-name="$name.insts.bin" \
        "${aiecc_extra[@]}" "$name.mlir" ) \
      || die "aiecc failed for $name (see output above)"
    cp "$work/$name.xclbin" "$work/$name.insts.bin" "$out/"
    q_block=1; [[ "$phase" == prefill ]] && q_block=32
    entries+=("$name:$phase:$d:$g:$q_block")
  done
done

"$python" "$here/manifest.py" --dir "$out" --generation "$generation" \
  --mlir-aie "$mlir_aie_version" --peano "$peano_version" \
  --max-context "$max_context" "${entries[@]}" \
  || die "manifest generation failed"
echo "artefacts and manifest.json in $out"
