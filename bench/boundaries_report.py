#!/usr/bin/env python3
"""bench/boundaries_report.py: a markdown table of vulkan/vulkan#2 layer-split runs per boundary
mode against `--backend vulkan`, from `engine bench` JSON files named
<shape>-tandem-<label>.json (labels: vulkan*, vv-<mode>-r<round>, or vv-r<round> / vvh-r<round>
for the default and host modes of an earlier build).

    python3 bench/boundaries_report.py DIR > table.md

Every ratio is written `ours / peer = r`; prefill and decode are the medians of the timed
repeats, tokens/s. Python 3 standard library only.
"""
import json
import os
import re
import sys

NAME = re.compile(r"^(?P<shape>.+?)-tandem-(?P<label>.+)\.json$")


def runs(path):
    with open(path) as f:
        doc = json.load(f)
    return {r["batch"]: (r["prefill_tokens_per_s"]["median"], r["decode_tokens_per_s"]["median"]) for r in doc["runs"]}


def fmt(v):
    return f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}"


def pair(a, b):
    return f"{fmt(a)} / {fmt(b)} = {a / b:.2f}"


def main(d):
    res = {}
    for n in sorted(os.listdir(d)):
        m = NAME.match(n)
        if m:
            res[m["label"]] = runs(os.path.join(d, n))
    base = next((res[k] for k in sorted(res) if k.startswith("vulkan")), None)
    print("| run (ours) / peer | batch | prefill tok/s | decode tok/s |")
    print("| --- | --- | --- | --- |")
    for label in sorted(k for k in res if k.startswith("vv")):
        for b, (pf, dc) in sorted(res[label].items()):
            if base and b in base:
                print(f"| {label} / vulkan | {b} | {pair(pf, base[b][0])} | {pair(dc, base[b][1])} |")
    # Each mode against the host path of the same round.
    for label in sorted(res):
        m = re.match(r"vv-(device|shared)-r(\d+)$", label)
        host = f"vv-host-r{m[2]}" if m else None
        if m is None:
            m2 = re.match(r"vv-r(\d+)$", label)
            host = f"vvh-r{m2[1]}" if m2 else None
        if host in res:
            for b, (pf, dc) in sorted(res[label].items()):
                if b in res[host]:
                    print(f"| {label} / {host} | {b} | {pair(pf, res[host][b][0])} | {pair(dc, res[host][b][1])} |")


if __name__ == "__main__":
    main(sys.argv[1])
