#!/usr/bin/env bash
# bench/prefill-probe.sh: where a 512-row prefill step's time goes on the GPU machine (issue 54's
# prefill cells): bench/decode-probe.sh with PHASE=prefill (CELLS, BUILDS, VARIANTS, ROUNDS,
# CONFORM and OUT as there). Here: `bash bench/package-device.sh .bench/new`. There (carrying
# .bench/new and .gl):
#   CELLS="gemma3-4b:q4_k" VARIANTS="cm2 load:TANDEM_VULKAN_CM2_DEQUANT=0 khr:TANDEM_VULKAN_CM2_KHR=1" bash bench/prefill-probe.sh
PHASE=prefill exec bash "$(dirname "${BASH_SOURCE[0]}")/decode-probe.sh"
