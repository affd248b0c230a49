#!/usr/bin/env bash
# bench/cm2-hints.sh: issue 54's `matmul_cm2` with alignment hints on its interior tiles (MODE
# bit 3: row strides set to k masked to a multiple of BK, k offsets masked, the interior walked
# in its own loop), as llama.cpp's mul_mm_cm2 hints NVIDIA's compiler. Runs bench/cm2-fixed.sh's
# steps with these lists: conformance of MODE 10 at 512-row tiles and at 16-row (batched) tiles;
# 4B q4_k and f16 prefill on the default (`matmul_khr`), `matmul_cm2` as before (MODE 2 for
# q4_k, 3 for f16) and with the hints (MODE 10, 14: 8 slices unrolled), at 128 x 256 tiles and
# with f16 accumulators; batched decode at 32 with MODE 10.
# Here: `bash bench/package-device.sh .bench/new`. There (carrying .bench/new and .gl):
#   bash bench/cm2-hints.sh 2>&1 | tee $OUT/cm2-hints.log
# (Written when q4_k and f16 prefill took the KHR kernels on a cooperative-matrix-2 device unless
# TANDEM_VULKAN_CM2_Q4K=1 / TANDEM_VULKAN_CM2_F16=1, as set below. Since the hints became the
# default, `matmul_cm2` is the default there and those two variables are ignored:
# TANDEM_VULKAN_CM2_KHR=1 takes the KHR kernels.)
set -uo pipefail
T="TANDEM_CONFORMANCE_MIN_TOL=3e-3"
Q="TANDEM_VULKAN_CM2_Q4K=1,TANDEM_VULKAN_CM2_DEQUANT=0,TANDEM_VULKAN_CM2_F16=1"
M="TANDEM_VULKAN_CM2_MODE"
CONFORM="h10:$T,$Q,$M=10 h10r16:$T,TANDEM_VULKAN_CM2_ROWS=16,$M=10" \
VARIANTS="base spec:$Q h10:$Q,$M=10 h14:$Q,$M=14 h10n256:$Q,$M=10,TANDEM_VULKAN_CM2_BN=256 h10h:$Q,$M=10,TANDEM_VULKAN_CM2_ACC=f16 h10n256h:$Q,$M=10,TANDEM_VULKAN_CM2_BN=256,TANDEM_VULKAN_CM2_ACC=f16" \
B32="base h10:$M=10 base h10:$M=10" DECODE="" \
    bash "$(dirname "${BASH_SOURCE[0]}")/cm2-fixed.sh"
