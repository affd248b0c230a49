#!/usr/bin/env python3
"""bench/layers_report.py: the markdown report of bench/layers.sh's results.

    mkdir r && tar -xzf results.tar.gz -C r
    python3 bench/layers_report.py r [MORE_DIRS_OR_FILES...] [--command 'PARTS=1b bash bench/layers.sh'] > report.md

Reads every JSON file under the directories given (recursively) whose name is
<shape>-<kind>[-<label>].json, as bench/layers.sh names them:
  <shape>-tandem-<label>.json  `engine bench` (tandem-bench/1: runs[].batch,
                               prefill_tokens_per_s.median, decode_tokens_per_s.median)
  <shape>-llama-<label>.json   `llama-bench -o json` (rows with n_prompt, n_gen, avg_ts, n_gpu_layers)
  <shape>-meta.json            layers, gpu_layers (N), lengths, the command (written by the script)
  <shape>-greedy.json          {"tokens": {placement: [ids]}}
and writes one table per shape to stdout: each row a comparison, prefill and decode each as
`ours / peer = ratio` with the tokens/s beside it; a missing result reads `–`. The first line
names the commands: --command's text, else those the meta files recorded, else `COMMAND`.
Python 3 standard library only.
"""
import argparse
import json
import os
import re
import sys

DASH = "–"
NAME = re.compile(r"^(?P<shape>.+?)-(?P<kind>tandem|llama|meta|greedy)(?:-(?P<label>.+))?\.json$")


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def collect(paths):
    """shape -> {"tandem": {label: doc}, "llama": {label: rows}, "meta": doc, "greedy": doc}."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".json")]
        elif p.endswith(".json"):
            files.append(p)
    shapes = {}
    for f in files:
        m = NAME.match(os.path.basename(f))
        if not m:
            continue
        doc = load_json(f)
        if doc is None:
            continue
        s = shapes.setdefault(m["shape"], {"tandem": {}, "llama": {}, "meta": {}, "greedy": {}})
        if m["kind"] in ("tandem", "llama") and m["label"]:
            s[m["kind"]][f"{m['kind']}-{m['label']}"] = doc
        elif m["kind"] in ("meta", "greedy") and not m["label"] and isinstance(doc, dict):
            s[m["kind"]] = doc
    return shapes


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def tandem_run(shape, label, batch):
    """(prefill, decode, lengths) medians of one batch of a tandem result; Nones when missing."""
    doc = shape["tandem"].get(label)
    if not isinstance(doc, dict):
        return None, None, None
    st = doc.get("settings") or {}
    lengths = None
    if num(st.get("prompt_tokens")) is not None and num(st.get("gen_tokens")) is not None:
        lengths = f"{st['prompt_tokens']}+{st['gen_tokens']}"
    for r in doc.get("runs") or []:
        if isinstance(r, dict) and r.get("batch") == batch:
            pf = num((r.get("prefill_tokens_per_s") or {}).get("median"))
            dc = num((r.get("decode_tokens_per_s") or {}).get("median"))
            return pf, dc, lengths
    return None, None, lengths


def llama_run(shape, label):
    """(pp avg_ts, tg avg_ts, lengths) of a llama-bench result; Nones when missing."""
    rows = shape["llama"].get(label)
    pp = tg = None
    np_ = ng = None
    for r in rows if isinstance(rows, list) else []:
        if not isinstance(r, dict):
            continue
        n_prompt, n_gen = r.get("n_prompt", 0), r.get("n_gen", 0)
        if n_prompt and not n_gen:
            pp, np_ = num(r.get("avg_ts")), n_prompt
        elif n_gen and not n_prompt:
            tg, ng = num(r.get("avg_ts")), n_gen
    lengths = f"{np_}+{ng}" if np_ is not None and ng is not None else None
    return pp, tg, lengths


def fmt(v):
    if v is None:
        return DASH
    return f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}"


def pair(a, b):
    """`a / b = a/b`, with `–` for anything missing."""
    r = f"{a / b:.2f}" if a is not None and b else DASH
    return f"{fmt(a)} / {fmt(b)} = {r}"


def lengths_cell(a, b):
    if a and b and a != b:
        return f"{a} vs {b}"
    return a or b or DASH


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, batch, ours, peer):
        """ours, peer: (prefill, decode, lengths). Runs of different lengths are not compared
        (their ratio reads `–`); a row with no result on either side is left out."""
        if all(v is None for v in (ours[0], ours[1], peer[0], peer[1])):
            return
        if ours[2] and peer[2] and ours[2] != peer[2]:
            ours, peer = (ours[0], ours[1], ours[2]), (None, None, peer[2])
        self.rows.append(
            f"| {name} | {batch} | {lengths_cell(ours[2], peer[2])} | {pair(ours[0], peer[0])} | {pair(ours[1], peer[1])} |"
        )

    def text(self):
        head = [
            "| comparison (ours / peer) | batch | tokens (prompt+gen) | prefill tok/s | decode tok/s |",
            "| --- | --- | --- | --- | --- |",
        ]
        return "\n".join(head + self.rows)


def gpu_layers(shape):
    """N: the meta file's, else the tandem-ngl<N> or llama-ngl<N> label's (the smallest not 99)."""
    n = num(shape["meta"].get("gpu_layers"))
    if n is not None:
        return int(n)
    found = sorted(
        int(m[1])
        for label in list(shape["tandem"]) + list(shape["llama"])
        for m in [re.match(r"(?:tandem|llama)-ngl(\d+)$", label)]
        if m and m[1] != "99"
    )
    return found[0] if found else None


def mb_batches(shape, n):
    b = shape["meta"].get("mb_batches")
    if isinstance(b, list) and b:
        return [x for x in b if isinstance(x, int)]
    found = set()
    for label in shape["tandem"]:
        m = re.match(rf"tandem-ngl{n}-b(\d+)-mb[12]$", label)
        if m:
            found.add(int(m[1]))
    return sorted(found) or [8, 32]


def vv_batches(shape):
    found = set()
    for label in ("tandem-vv", "tandem-vulkan"):
        doc = shape["tandem"].get(label)
        if isinstance(doc, dict):
            found |= {r.get("batch") for r in doc.get("runs") or [] if isinstance(r, dict)}
    return sorted(b for b in found if isinstance(b, int)) or [1, 8]


def greedy_line(shape):
    toks = shape["greedy"].get("tokens")
    if not isinstance(toks, dict) or not toks:
        return f"Greedy ids: {DASH}"
    names = ", ".join(f"`{k}`" for k in toks)
    vals = list(toks.values())
    if None in vals:
        failed = ", ".join(f"`{k}`" for k, v in toks.items() if v is None)
        return f"Greedy ids ({names}): no result from {failed}."
    if all(v == vals[0] for v in vals):
        return f"Greedy ids ({len(vals[0])} tokens) agree on {names}."
    lines = [f"Greedy ids DIFFER on {names}:"]
    lines += [f"- `{k}`: {v}" for k, v in toks.items()]
    return "\n".join(lines)


def small_section(name, shape):
    n = gpu_layers(shape)
    meta = shape["meta"]
    L = meta.get("layers")
    out = [f"## {name}" + (f" ({L} layers, N = {n})" if L else f" (N = {n})"), ""]
    if n is None:
        out.append(f"No --gpu-layers result: {DASH}")
        return out
    t = Table()
    ngl = f"tandem-ngl{n}"
    t.add(f"tandem --gpu-layers {n} / llama.cpp -ngl {n}", 1, tandem_run(shape, ngl, 1), llama_run(shape, f"llama-ngl{n}"))
    t.add(
        f"tandem --gpu-layers {n} / llama.cpp -ngl {n + 1} ({n} layers and the head on the GPU)",
        1,
        tandem_run(shape, ngl, 1),
        llama_run(shape, f"llama-ngl{n + 1}"),
    )
    t.add("tandem vulkan / llama.cpp -ngl 99", 1, tandem_run(shape, "tandem-vulkan", 1), llama_run(shape, "llama-ngl99"))
    t.add(f"tandem --gpu-layers {n} / tandem vulkan", 1, tandem_run(shape, ngl, 1), tandem_run(shape, "tandem-vulkan", 1))
    t.add(f"llama.cpp -ngl {n} / llama.cpp -ngl 99", 1, llama_run(shape, f"llama-ngl{n}"), llama_run(shape, "llama-ngl99"))
    for b in vv_batches(shape):
        t.add("vulkan+vulkan#2 layers / vulkan", b, tandem_run(shape, "tandem-vv", b), tandem_run(shape, "tandem-vulkan", b))
    host = "tandem-vv-host" in shape["tandem"]
    if host:
        for b in vv_batches(shape):
            t.add(
                "vulkan+vulkan#2 layers, host boundaries / vulkan",
                b,
                tandem_run(shape, "tandem-vv-host", b),
                tandem_run(shape, "tandem-vulkan", b),
            )
            t.add(
                "vulkan+vulkan#2 layers: device / host boundaries",
                b,
                tandem_run(shape, "tandem-vv", b),
                tandem_run(shape, "tandem-vv-host", b),
            )
    if f"{ngl}-host" in shape["tandem"]:
        t.add(
            f"--gpu-layers {n}: device / host boundaries",
            1,
            tandem_run(shape, ngl, 1),
            tandem_run(shape, f"{ngl}-host", 1),
        )
    for label in sorted(shape["tandem"]):
        m = re.match(r"tandem-vv-b(\d+)-mb2$", label)
        if m:
            b = int(m[1])
            t.add("vulkan+vulkan#2 layers: micro_batches 2 / 1", b, tandem_run(shape, label, b), tandem_run(shape, "tandem-vv", b))
    for b in mb_batches(shape, n):
        t.add(
            f"micro_batches 2 / micro_batches 1 (--gpu-layers {n})",
            b,
            tandem_run(shape, f"{ngl}-b{b}-mb2", b),
            tandem_run(shape, f"{ngl}-b{b}-mb1", b),
        )
    out.append(t.text())
    out.append("")
    out.append(greedy_line(shape))
    if meta.get("vv_config"):
        out.append(f"\nvulkan+vulkan#2 layers: `{meta['vv_config'].strip()}` with `--backend auto`.")
    if host:
        out.append(boundary_cost(shape))
    return out


def boundary_cost(shape):
    """The cost of one boundary at batch 1 decode: (1/vv - 1/vulkan) per step over the two
    crossings of a layer split (there and back), for device and host boundaries."""
    _, v, _ = tandem_run(shape, "tandem-vulkan", 1)
    parts = []
    for label, what in (("tandem-vv", "device"), ("tandem-vv-host", "host")):
        _, d, _ = tandem_run(shape, label, 1)
        if v and d:
            parts.append(f"{what} boundaries {(1 / d - 1 / v) / 2 * 1e6:.0f} µs")
    if not parts:
        return ""
    return (
        "\nCost per boundary at batch 1 decode, `(1/vv - 1/vulkan) / 2` (two crossings per token): "
        + "; ".join(parts)
        + "."
    )


def big_section(name, shape):
    n = gpu_layers(shape)
    meta = shape["meta"]
    L = meta.get("layers", DASH)
    limit = meta.get("memory_limit", DASH)
    out = [f"## {name} (`[backend.vulkan] memory_limit = \"{limit}\"`, `--backend auto`: N = {n if n is not None else DASH} of {L} layers on vulkan)", ""]
    t = Table()
    ours = tandem_run(shape, "tandem-auto", 1)
    if n is None:
        t.add("tandem auto / llama.cpp -ngl N", 1, ours, (None, None, None))
    else:
        t.add(f"tandem auto ({n} layers on vulkan) / llama.cpp -ngl {n}", 1, ours, llama_run(shape, f"llama-ngl{n}"))
        t.add(
            f"tandem auto ({n} layers on vulkan) / llama.cpp -ngl {n + 1} ({n} layers and the head on the GPU)",
            1,
            ours,
            llama_run(shape, f"llama-ngl{n + 1}"),
        )
    out.append(t.text())
    for key, what in (("layers_line", "placement"), ("note", "engine run")):
        if meta.get(key):
            out.append(f"\n{what}: `{meta[key].strip()}`")
    return out


def raw_section(shapes):
    out = ["## All results", "", "| shape | result | batch | tokens (prompt+gen) | prefill tok/s | decode tok/s |", "| --- | --- | --- | --- | --- | --- |"]
    for sname in sorted(shapes):
        s = shapes[sname]
        for label in sorted(s["tandem"]):
            doc = s["tandem"][label]
            runs = [r for r in (doc.get("runs") or []) if isinstance(r, dict)] if isinstance(doc, dict) else []
            placement = ((doc.get("backend") or {}).get("placement") if isinstance(doc, dict) else None) or ""
            for r in runs:
                pf, dc, ln = tandem_run(s, label, r.get("batch"))
                what = f"{label}" + (f" (`{placement}`)" if placement else "")
                out.append(f"| {sname} | {what} | {r.get('batch')} | {ln or DASH} | {fmt(pf)} | {fmt(dc)} |")
        for label in sorted(s["llama"]):
            pp, tg, ln = llama_run(s, label)
            out.append(f"| {sname} | {label} | 1 | {ln or DASH} | {fmt(pp)} | {fmt(tg)} |")
    return out


def main(argv):
    ap = argparse.ArgumentParser(description="Markdown report of bench/layers.sh's JSON results.")
    ap.add_argument("paths", nargs="+", help="directories (searched recursively) or JSON files")
    ap.add_argument("--command", action="append", default=[], help="the command(s) that made the results (repeatable)")
    args = ap.parse_args(argv)
    shapes = collect(args.paths)
    commands = args.command or sorted({s["meta"]["command"] for s in shapes.values() if isinstance(s["meta"].get("command"), str)})
    out = ["# Layer splits beside llama.cpp's partial offload", ""]
    out.append("Commands: " + ("; ".join(f"`{c}`" for c in commands) if commands else "COMMAND"))
    out.append(f"Report: `python3 bench/layers_report.py {' '.join(args.paths)}`")
    out.append("")
    out.append(
        "Medians of tandem's timed repeats and llama-bench's averages, tokens/s. Every ratio is "
        "`ours / peer`. llama.cpp's `-ngl K` puts its last K-1 layers and the output head on the GPU "
        "(the embedding stays on the CPU); tandem's `--gpu-layers N` puts layers 0..N-1, the embedding "
        "and the head there. llama.cpp's prefill may run CPU-held weights on the GPU (its op offload, "
        "on by default for large batches)."
    )
    if not shapes:
        out += ["", f"No results found: {DASH}"]
    order = sorted(shapes, key=lambda s: (s.endswith("27b"), s))
    for sname in order:
        out.append("")
        if sname.endswith("27b") or "tandem-auto" in shapes[sname]["tandem"]:
            out += big_section(sname, shapes[sname])
        else:
            out += small_section(sname, shapes[sname])
    if shapes:
        out.append("")
        out += raw_section(shapes)
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
