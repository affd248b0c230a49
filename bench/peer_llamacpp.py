#!/usr/bin/env python3
"""The llama.cpp peer beside `engine bench`: llama-bench's JSON result in tandem's bench schema.

Runs llama-bench (a build of llama.cpp the user made; nothing here builds or ships it) with
`-o json`, or reads a JSON file it wrote, and writes one result in tandem's bench schema
(docs/bench-schema.json, `tandem-bench/1`) so that `engine bench --report DIR a.json b.json` puts
it beside tandem's. It expects llama-bench's usual pair of tests: one prompt test (`n_prompt` > 0,
`n_gen` = 0: pp) and one generation test (`n_prompt` = 0, `n_gen` > 0: tg), one thread count.

How llama-bench's figures map to the schema, and where they differ from `engine bench`:
  prefill tok/s     pp's per-repeat rates (`samples_ts`): median, min, max.
  decode tok/s      tg's per-repeat rates. llama-bench generates its n_gen tokens from an empty
                    context (no prompt before them); `engine bench` decodes after the prompt.
  ttft ms           pp's per-repeat times (`samples_ns`): the prompt's time, without sampling.
  token latency     llama-bench records no per-step times: the percentiles are over the repeats'
                    mean step times (tg time / n_gen), not over single steps.
  decode bytes      the file's tensor bytes (`model_size`) plus an f16 KV cache (llama.cpp's
                    default) at the decode's median context (n_gen / 2 tokens), from the GGUF's
                    layer count, KV heads and key/value lengths.
  peak RSS          the llama-bench process's peak resident memory (the child's rusage) when this
                    script runs it; with --from-json it must be given (--peak-rss-bytes).
  limits            copy bandwidth: measured here, a 1 GiB bytearray copy (memcpy), counting read
                    plus written bytes as the schema says; peak FLOP/s: llama-bench measures none,
                    so it is taken from a tandem result of the same machine and session
                    (--peak-from), and its source says so.

Usage:
  peer_llamacpp.py --llama-bench PATH --model M.gguf --threads 2 --prompt-tokens 512 \\
                   --gen-tokens 128 --repeat 3 --peak-from tandem.json --out llamacpp.json
  peer_llamacpp.py --from-json raw.json --model M.gguf --peak-rss-bytes N \\
                   --peak-from tandem.json --out llamacpp.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time

SCHEMA_ID = "tandem-bench/1"
GIB = 1 << 30


def fail(msg: str) -> None:
    print(f"peer_llamacpp: error: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--llama-bench", help="the llama-bench executable to run")
    src.add_argument("--from-json", help="a JSON file llama-bench wrote with -o json")
    p.add_argument("--model", required=True, help="the GGUF file llama-bench ran")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--peak-rss-bytes", type=int, help="the llama-bench process's peak RSS (with --from-json)")
    p.add_argument("--peak-from", required=True, help="a tandem result (engine bench --json) of this machine and session")
    p.add_argument("--raw-out", help="also keep llama-bench's own JSON here (when run)")
    p.add_argument("--out", required=True, help="the JSON result to write")
    a = p.parse_args(argv)
    if a.from_json and a.peak_rss_bytes is None:
        p.error("--from-json needs --peak-rss-bytes (llama-bench does not report its memory)")
    return a


# --- the machine -------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def copy_bandwidth() -> float:
    """Bytes read plus written per second by a 1 GiB memcpy (best of 5)."""
    src = bytearray(b"\x01") * GIB
    dst = bytearray(GIB)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst[:] = src
        best = min(best, time.perf_counter() - t)
    return 2 * GIB / best


# --- the GGUF header ---------------------------------------------------------------------------


def gguf_metadata(path: str) -> dict:
    """The GGUF's key-value metadata (scalars and strings; arrays skipped)."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:

        def read(fmt: str):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))

        def string() -> str:
            (n,) = read("Q")
            return f.read(n).decode("utf-8", "replace")

        def value(t: int):
            if t in scalar:
                return read(scalar[t])[0]
            if t == 8:
                return string()
            if t == 9:
                at, n = read("IQ")
                for _ in range(n):
                    value(at)
                return None
            fail(f"{path}: unknown GGUF value type {t}")

        magic, version = read("4sI")
        if magic != b"GGUF":
            fail(f"{path} is not a GGUF file")
        _tensors, kvs = read("QQ")
        meta = {}
        for _ in range(kvs):
            key = string()
            (t,) = read("I")
            meta[key] = value(t)
        return meta


def kv_bytes_per_token(meta: dict) -> int:
    """f16 keys and values of every layer for one token."""
    arch = meta.get("general.architecture")
    try:
        layers = meta[f"{arch}.block_count"]
        heads_kv = meta.get(f"{arch}.attention.head_count_kv", meta[f"{arch}.attention.head_count"])
        key = meta.get(f"{arch}.attention.key_length")
        val = meta.get(f"{arch}.attention.value_length")
        if key is None or val is None:
            key = val = meta[f"{arch}.embedding_length"] // meta[f"{arch}.attention.head_count"]
    except KeyError as e:
        fail(f"the GGUF has no {e} for {arch}")
    return layers * heads_kv * (key + val) * 2


# --- llama-bench -------------------------------------------------------------------------------


def run_llama_bench(a: argparse.Namespace) -> tuple[list, int]:
    cmd = [
        a.llama_bench, "-m", a.model, "-t", str(a.threads), "-p", str(a.prompt_tokens),
        "-n", str(a.gen_tokens), "-r", str(a.repeat), "-o", "json",
    ]
    print(f"peer_llamacpp: running {' '.join(cmd)}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        fail(f"llama-bench exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
    if a.raw_out:
        with open(a.raw_out, "w", encoding="utf-8") as f:
            f.write(done.stdout)
    try:
        return json.loads(done.stdout), rss
    except json.JSONDecodeError as e:
        fail(f"llama-bench's output is not JSON ({e})")


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def percentile(sorted_values: list[float], q: float) -> float:
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def convert(raw: list, rss: int, a: argparse.Namespace, started: str) -> dict:
    if not isinstance(raw, list):
        fail("expected llama-bench's JSON list of tests")
    pp = [t for t in raw if t.get("n_prompt", 0) > 0 and t.get("n_gen", 0) == 0]
    tg = [t for t in raw if t.get("n_prompt", 0) == 0 and t.get("n_gen", 0) > 0]
    if len(pp) != 1 or len(tg) != 1:
        fail(f"expected one prompt test and one generation test, found {len(pp)} and {len(tg)}")
    pp, tg = pp[0], tg[0]
    for key in ("samples_ts", "samples_ns", "model_size", "model_n_params", "n_threads", "build_commit"):
        if key not in pp or key not in tg:
            fail(f"llama-bench's result has no {key!r}")
    if len(pp["samples_ts"]) != len(tg["samples_ts"]):
        fail("the prompt and generation tests have different repeat counts")
    with open(a.peak_from, encoding="utf-8") as f:
        tandem = json.load(f)
    peak = tandem.get("limits", {}).get("peak_flops")
    if not peak:
        fail(f"{a.peak_from} has no limits.peak_flops")
    if tandem.get("machine", {}).get("host") != socket.gethostname():
        fail(f"{a.peak_from} was measured on another host")

    meta = gguf_metadata(a.model)
    n_prompt, n_gen = pp["n_prompt"], tg["n_gen"]
    params, weight_bytes = int(pp["model_n_params"]), int(pp["model_size"])
    decode_bytes = weight_bytes + kv_bytes_per_token(meta) * (n_gen // 2)
    bw = copy_bandwidth()

    prefill_s = [ns / 1e9 for ns in pp["samples_ns"]]
    step_ms = sorted(ns / 1e6 / n_gen for ns in tg["samples_ns"])
    med_step_s = statistics.median(step_ms) / 1e3
    med_prefill_s = statistics.median(prefill_s)
    label = meta.get("general.size_label", "").lower()
    arch = meta.get("general.architecture", "model")
    file_type = os.path.splitext(os.path.basename(a.model))[0]
    return {
        "schema": SCHEMA_ID,
        "tool": "llama.cpp",
        "date": started,
        "machine": {"host": socket.gethostname(), "cpu": cpu_name(), "cores": cores(), "os": sys.platform.replace("darwin", "macos"), "gpu": None},
        "backend": {
            "name": "cpu",
            "device": f"{pp.get('cpu_info', cpu_name())}, {pp['n_threads']} threads (llama.cpp {pp['build_commit']})",
            "kind": "cpu",
        },
        "model": {
            "name": tandem.get("model", {}).get("name") or f"{arch}-{label}",
            "source": os.path.abspath(a.model),
            "dtype": tandem.get("model", {}).get("dtype") or file_type,
            "params": params,
            "weight_bytes": weight_bytes,
            "synthetic": False,
        },
        "settings": {"prompt_tokens": n_prompt, "gen_tokens": n_gen, "repeat": len(pp["samples_ts"]), "warmup": 1, "batch": [1]},
        "limits": {
            "copy_bandwidth_bytes_per_s": bw,
            "copy_bandwidth_source": "host memcpy 1 GiB (Python bytearray copy, read + write)",
            "peak_flops": peak,
            "peak_flops_source": f"tandem's run in the same session: {tandem['limits'].get('peak_flops_source', '?')}",
        },
        "runs": [
            {
                "batch": 1,
                "prefill_tokens_per_s": spread(pp["samples_ts"]),
                "decode_tokens_per_s": spread(tg["samples_ts"]),
                "ttft_ms": spread([s * 1e3 for s in prefill_s]),
                "token_latency_ms": {"p50": percentile(step_ms, 0.5), "p90": percentile(step_ms, 0.9), "p99": percentile(step_ms, 0.99)},
                "decode_bytes_per_step": decode_bytes,
                "decode_bandwidth_fraction": (decode_bytes / med_step_s) / bw,
                "prefill_flops_fraction": (2 * params * n_prompt / med_prefill_s) / peak,
                "peak_rss_bytes": rss,
                "device_memory_bytes": None,
            }
        ],
    }


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if a.llama_bench:
        raw, rss = run_llama_bench(a)
    else:
        with open(a.from_json, encoding="utf-8") as f:
            raw = json.load(f)
        rss = a.peak_rss_bytes
    result = convert(raw, rss, a, started)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    r = result["runs"][0]
    print(
        f"peer_llamacpp: prefill {r['prefill_tokens_per_s']['median']:.1f} tok/s, "
        f"decode {r['decode_tokens_per_s']['median']:.1f} tok/s -> {a.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
