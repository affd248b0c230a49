#!/usr/bin/env python3
"""Speculative decoding's GPU figures as markdown: the verification curves of
bench/speculative-gpu.sh (`verify-<shape>.json`), the draft's decode step (`draft-270m-<backend>.json`)
and the predicted speedups they give, with the draft's own cost counted.

    python3 bench/speculative_gpu_report.py DIR > DIR/curve.md

The prediction, per acceptance rate a (each draft token accepted with probability a, independently)
and depth k (drafts per block): a block yields E = (1 - a^(k+1)) / (1 - a) tokens (the accepted
prefix plus the target's own next token). A block costs
- free draft: verify(k+1), the draft's time hidden entirely (the bench's own prediction);
- draft on the CPU running ahead (another unit, overlapped): max(verify(k+1), k * step_cpu);
- draft on the same GPU (no overlap: the units queue one after the other): verify(k+1) + k * step_gpu;
and the speedup is E * verify(1) / cost, at the best k of 1..15 (k + 1 <= 16 rows).
"""

import json
import os
import sys

RATES = [0.5, 0.6, 0.7, 0.8, 0.9]


def load(path):
    with open(path) as f:
        return json.load(f)


def curve(d):
    c = d.get("verify_curve") or []
    return {p["rows"]: p["ms"] for p in c}


def draft_step_ms(d):
    # One decode token of the draft at batch 1: the median decode rate's inverse.
    return 1000.0 / d["runs"][0]["decode_tokens_per_s"]["median"]


def best(ms, a, cost):
    top = (0.0, 0)
    for k in range(1, 16):
        if k + 1 not in ms:
            break
        e = (1 - a ** (k + 1)) / (1 - a)
        s = e * ms[1] / cost(k)
        if s > top[0]:
            top = (s, k)
    return top


def main(folder):
    shapes = sorted(
        f[len("verify-") : -len(".json")]
        for f in os.listdir(folder)
        if f.startswith("verify-") and f.endswith(".json")
    )
    steps = {}
    for b in ("cpu", "vulkan"):
        p = os.path.join(folder, f"draft-270m-{b}.json")
        if os.path.exists(p):
            steps[b] = draft_step_ms(load(p))
    curves = {s: curve(load(os.path.join(folder, f"verify-{s}.json"))) for s in shapes}
    rows = sorted({r for c in curves.values() for r in c})
    print("## Verification cost: one target step of N rows of one sequence against one row (Vulkan)\n")
    print("| rows | " + " | ".join(f"{s} ms (ratio)" for s in shapes) + " |")
    print("| --- |" + " --- |" * len(shapes))
    for r in rows:
        cells = []
        for s in shapes:
            ms = curves[s].get(r)
            cells.append(f"{ms:.2f} ({ms / curves[s][1]:.2f})" if ms else "")
        print(f"| {r} | " + " | ".join(cells) + " |")
    print()
    for b, t in steps.items():
        print(f"- The 270M-shaped draft's decode step on `{b}`: {t:.2f} ms (batch 1, median rate).")
    print()
    print("## Predicted speedup over plain decode (best depth k in brackets)\n")
    heads = ["free draft"]
    if "cpu" in steps:
        heads.append("270M draft on the CPU, running ahead")
    if "vulkan" in steps:
        heads.append("270M draft on the same GPU, in turn")
    print("| shape | acceptance | " + " | ".join(heads) + " |")
    print("| --- | --- |" + " --- |" * len(heads))
    for s in shapes:
        ms = curves[s]
        for a in RATES:
            cells = []
            sp, k = best(ms, a, lambda k: ms[k + 1])
            cells.append(f"{sp:.2f}x (k={k})")
            if "cpu" in steps:
                sp, k = best(ms, a, lambda k: max(ms[k + 1], k * steps["cpu"]))
                cells.append(f"{sp:.2f}x (k={k})")
            if "vulkan" in steps:
                sp, k = best(ms, a, lambda k: ms[k + 1] + k * steps["vulkan"])
                cells.append(f"{sp:.2f}x (k={k})")
            print(f"| {s} | {a} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: speculative_gpu_report.py DIR")
    main(sys.argv[1])
