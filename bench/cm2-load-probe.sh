#!/usr/bin/env bash
# bench/cm2-load-probe.sh: issue 54's 27B prefill cell (0.83 of llama.cpp's after the alignment
# hints, bench/results/2026-11-29-cm2-27b-batched). On a cooperative-matrix-2 device q4_k's
# prefill products dequantise each weight to f16 and multiply it on `matmul_cm2`; on 27B that
# pass writes about 2 bytes a weight each step. Decoding in `matmul_cm2`'s loads skips it but ran
# slower on 4B (28.34 ms of products a step against 22.34, bench/results/2026-11-29-cm2-default).
# This probes the decoding loads' untried differences from llama.cpp's callback, tandem only,
# one device call:
#   1. the conformance binary with MODE 58 (10 | 16: unclamped decoded weights | 32: q4_k's
#      shared scale rows padded to BM + 2), q4_k decoded in the loads from 16 rows;
#   2. bench/prefill-probe.sh on CELLS (4B and 27B q4_k) with VARIANTS: the default (dequantised
#      first), decoded in the loads at MODE 10, 26, 42 and 58, and the default under f16
#      accumulators (`--precision fast`'s products);
#   3. batched decode at 32 sequences on 4B q4_k (decoded in the loads there): MODE 10 against
#      58 (`engine bench --batch 32 --prompt-tokens 128 --gen-tokens 64 --repeat 3`, twice).
# Here: `bash bench/package-device.sh .bench/new`. There (carrying .bench/new and .gl):
#   bash bench/cm2-load-probe.sh 2>&1 | tee $OUT/cm2-load-probe.log
set -uo pipefail
T="TANDEM_CONFORMANCE_MIN_TOL=3e-3"
L="TANDEM_VULKAN_CM2_DEQUANT=0"
M="TANDEM_VULKAN_CM2_MODE"
CONFORM=${CONFORM-"l58:$T,$L,$M=58,TANDEM_VULKAN_CM2_ROWS=16"} \
VARIANTS=${VARIANTS-"dq l10:$L,$M=10 l26:$L,$M=26 l42:$L,$M=42 l58:$L,$M=58 dqh:TANDEM_VULKAN_CM2_ACC=f16"} \
CELLS=${CELLS-"gemma3-4b:q4_k gemma3-27b:q4_k"} B32=${B32-"l10:$M=10 l58:$M=58 l10:$M=10 l58:$M=58"} DECODE="" \
    bash "$(dirname "${BASH_SOURCE[0]}")/cm2-fixed.sh"
