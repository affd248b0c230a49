#!/usr/bin/env python3
"""The peer beside `engine bench`: Hugging Face transformers on the same Gemma 3 shapes.

Builds a Gemma 3 text model of a real shape with random bf16 weights (no download: the shapes are
written below, as `engine synth` writes them), then for each batch size measures prefill tokens/s,
decode tokens/s, time to first token and per-token latency over --repeat runs after --warmup
runs, and writes one result in tandem's bench schema (docs/bench-schema.json, `tandem-bench/1`)
so that `engine bench --report` puts it beside tandem's.

Modes:
  eager    `generate` with the default dynamic cache, no compilation;
  compile  `generate` with `cache_implementation="static"`: transformers' documented fast path,
           which compiles the decode step with torch.compile (inductor, "reduce-overhead", i.e.
           CUDA graphs) on CUDA. Off CUDA it is asked to compile all the same (mode "default").

The same run measures, after the batch sizes (so that its buffers count in no run's peak memory),
the limits the fractions are taken against:
  copy bandwidth  a device-to-device copy of 1 GiB (torch `copy_`), counting bytes read plus
                  bytes written: 2 GiB moved per copy, as the schema says;
  peak FLOP/s     a dense f16 matrix product of 8192x8192x8192 on CUDA (2048^3 in f32 on the
                  CPU, where bf16 products are rarely the fastest), counting 2*M*N*K per product.

How a run is timed: a logits processor records the time (after a device synchronisation) each
time `generate` has computed the next-token logits. The first record ends the prefill: time to
first token = first record - start, prefill tokens/s = batch * prompt tokens / that time. Each
later record ends one decode step: latencies are the gaps between records, and decode tokens/s =
batch * (gen tokens - 1) / (last record - first record).

Batch sizes that run out of device memory are left out of the result, with a warning on stderr.

Usage:
  peer_torch.py --shape gemma3-1b --batch 1,8,32 --prompt-tokens 512 --gen-tokens 128 \\
                --repeat 3 --mode eager --out FILE
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import resource
import socket
import statistics
import sys
import time

SCHEMA_ID = "tandem-bench/1"

# The shapes `engine synth` writes (engine/src/checkpoint/synth.rs): hidden, intermediate, layers, query
# heads, kv heads, head dim, vocabulary, sliding window, linear rope factor of the global layers.
SHAPES = {
    "tiny": dict(hidden=256, inter=512, layers=2, heads=4, kv=1, head_dim=64, vocab=512, window=64, rope=None),
    "gemma3-270m": dict(hidden=640, inter=2048, layers=18, heads=4, kv=1, head_dim=256, vocab=262_144, window=512, rope=None),
    "gemma3-1b": dict(hidden=1152, inter=6912, layers=26, heads=4, kv=1, head_dim=256, vocab=262_144, window=512, rope=None),
    "gemma3-4b": dict(hidden=2560, inter=10_240, layers=34, heads=8, kv=4, head_dim=256, vocab=262_208, window=1024, rope=8.0),
    "gemma3-12b": dict(hidden=3840, inter=15_360, layers=48, heads=16, kv=8, head_dim=256, vocab=262_208, window=1024, rope=8.0),
    "gemma3-27b": dict(hidden=5376, inter=21_504, layers=62, heads=32, kv=16, head_dim=128, vocab=262_208, window=1024, rope=8.0),
}

GIB = 1 << 30


def warn(msg: str) -> None:
    print(f"peer_torch: warning: {msg}", file=sys.stderr, flush=True)


def info(msg: str) -> None:
    print(f"peer_torch: {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the JSON result to write")
    a = p.parse_args(argv)
    try:
        a.batches = [int(b) for b in a.batch.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch: expected comma-separated integers, got {a.batch!r}")
    if not a.batches or min(a.batches) < 1:
        p.error("--batch: every batch size must be at least 1")
    if a.prompt_tokens < 1 or a.gen_tokens < 2:
        p.error("--prompt-tokens must be at least 1 and --gen-tokens at least 2")
    if a.repeat < 1 or a.warmup < 0:
        p.error("--repeat must be at least 1 and --warmup at least 0")
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


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return rss if sys.platform == "darwin" else rss * 1024


# --- statistics --------------------------------------------------------------------------------


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# --- the limits --------------------------------------------------------------------------------


def measure_copy_bandwidth(torch, device, sync) -> tuple[float, str]:
    """Bytes read plus written per second by a device-to-device copy of 1 GiB."""
    src = torch.empty(GIB, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync()
    n = 10
    t0 = time.perf_counter()
    for _ in range(n):
        dst.copy_(src)
    sync()
    dt = time.perf_counter() - t0
    del src, dst
    free_device_memory(torch, device)
    where = "cuda device-to-device" if device.type == "cuda" else "host"
    return 2 * GIB * n / dt, f"torch {where} copy of 1 GiB, bytes read + written"


def measure_peak_flops(torch, device, sync) -> tuple[float, str]:
    """The best FLOP/s of a large dense matrix product."""
    if device.type == "cuda":
        n, dtype, name = 8192, torch.float16, "f16"
    else:
        n, dtype, name = 2048, torch.float32, "f32"
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        c = a @ b
    sync()
    reps = 10 if device.type == "cuda" else 3
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        c = a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    del a, b, c
    free_device_memory(torch, device)
    return 2 * n**3 / best, f"torch {name} matmul {n}x{n}x{n} (best of {reps})"


def free_device_memory(torch, device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- the model ---------------------------------------------------------------------------------


def build_config(shape: str, max_positions: int):
    from transformers import Gemma3TextConfig

    s = SHAPES[shape]
    full = {"rope_type": "default", "rope_theta": 1_000_000.0}
    if s["rope"] is not None:
        full = {"rope_type": "linear", "factor": s["rope"], "rope_theta": 1_000_000.0}
    return Gemma3TextConfig(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["inter"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        head_dim=s["head_dim"],
        # Gemma 3 27B scales attention by (hidden / heads)^-0.5, the others by head_dim^-0.5.
        query_pre_attn_scalar=s["hidden"] // s["heads"] if shape == "gemma3-27b" else s["head_dim"],
        sliding_window=s["window"],
        max_position_embeddings=max(max_positions, 32_768),
        rope_parameters={
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        tie_word_embeddings=True,
    )


def build_model(torch, config, device):
    """A model with random bf16 weights, made directly on the device (no host copy)."""
    from transformers import Gemma3ForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device:
            model = Gemma3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def decode_bytes_per_step(config, weight_bytes: int, batch: int, context: int) -> int:
    """Weights (the tied embedding is read whole by the output head) plus the KV cache that one
    decode step reads at `context` tokens: K and V, bf16, a sliding window on local layers."""
    per_token = config.num_key_value_heads * config.head_dim * 2 * 2
    kv = 0
    for kind in config.layer_types:
        tokens = min(context, config.sliding_window) if kind == "sliding_attention" else context
        kv += tokens * per_token
    return weight_bytes + batch * kv


# --- one timed run -----------------------------------------------------------------------------


def make_clock(sync):
    from transformers import LogitsProcessor

    class StepClock(LogitsProcessor):
        """Records the time each step's logits are ready."""

        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            sync()
            self.times.append(time.perf_counter())
            return scores

    return StepClock()


def one_run(torch, model, input_ids, args, sync) -> dict:
    from transformers import LogitsProcessorList

    clock = make_clock(sync)
    kwargs = dict(
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=args.gen_tokens,
        min_new_tokens=args.gen_tokens,
        do_sample=False,
        logits_processor=LogitsProcessorList([clock]),
        pad_token_id=0,
    )
    if args.mode == "compile":
        from transformers import CompileConfig

        kwargs["cache_implementation"] = "static"
        if input_ids.device.type != "cuda":
            config = CompileConfig(mode="default")
            config._compile_all_devices = True
            kwargs["compile_config"] = config
    sync()
    t0 = time.perf_counter()
    out = model.generate(input_ids, **kwargs)
    sync()
    generated = out.shape[1] - input_ids.shape[1]
    if generated != args.gen_tokens or len(clock.times) != args.gen_tokens:
        raise RuntimeError(
            f"generate made {generated} tokens in {len(clock.times)} steps, expected {args.gen_tokens}"
        )
    batch = input_ids.shape[0]
    ttft = clock.times[0] - t0
    decode = clock.times[-1] - clock.times[0]
    steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return {
        "ttft_s": ttft,
        "prefill_tps": batch * args.prompt_tokens / ttft,
        "decode_tps": batch * (args.gen_tokens - 1) / decode,
        "steps_s": steps,
    }


def is_oom(torch, err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def bench_batch(torch, model, config, args, batch, device, sync, sizes) -> dict | None:
    """One batch size's entry of `runs`, its fractions still to be filled in by `add_fractions`
    from the private `_` keys once the limits are measured; None when it ran out of memory."""
    gen = torch.Generator(device="cpu").manual_seed(args.seed + batch)
    # Token ids above the special ones; random text, as the weights are random too.
    input_ids = torch.randint(8, config.vocab_size, (batch, args.prompt_tokens), generator=gen).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        for i in range(args.warmup):
            info(f"batch {batch}: warm-up {i + 1}/{args.warmup}")
            one_run(torch, model, input_ids, args, sync)
        runs = []
        for i in range(args.repeat):
            r = one_run(torch, model, input_ids, args, sync)
            info(
                f"batch {batch}: run {i + 1}/{args.repeat}: prefill {r['prefill_tps']:.1f} tok/s, "
                f"decode {r['decode_tps']:.1f} tok/s"
            )
            runs.append(r)
    except Exception as err:  # noqa: BLE001 - only out-of-memory is expected; the rest re-raises
        if not is_oom(torch, err):
            raise
        oom = str(err).splitlines()[0] if str(err) else type(err).__name__
    else:
        oom = None
    if oom is not None:
        # Outside the handler, so that the traceback's frames (and their tensors) are gone.
        warn(f"batch {batch} ran out of device memory and is left out of the result: {oom}")
        del input_ids
        free_device_memory(torch, device)
        return None
    steps = sorted(s * 1000.0 for r in runs for s in r["steps_s"])
    ttft_ms = [r["ttft_s"] * 1000.0 for r in runs]
    step_p50_s = percentile(steps, 0.5) / 1000.0
    median_context = args.prompt_tokens + args.gen_tokens // 2
    step_bytes = decode_bytes_per_step(config, sizes["weight_bytes"], batch, median_context)
    flops = 2.0 * sizes["params"] * batch * args.prompt_tokens
    device_memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    del input_ids
    free_device_memory(torch, device)
    return {
        "batch": batch,
        "prefill_tokens_per_s": spread([r["prefill_tps"] for r in runs]),
        "decode_tokens_per_s": spread([r["decode_tps"] for r in runs]),
        "ttft_ms": spread(ttft_ms),
        "token_latency_ms": {
            "p50": percentile(steps, 0.50),
            "p90": percentile(steps, 0.90),
            "p99": percentile(steps, 0.99),
        },
        "decode_bytes_per_step": step_bytes,
        "decode_bandwidth_fraction": None,
        "prefill_flops_fraction": None,
        "peak_rss_bytes": peak_rss_bytes(),
        "device_memory_bytes": device_memory,
        "_bytes_per_s": step_bytes / step_p50_s,
        "_flops_per_s": flops / (statistics.median(ttft_ms) / 1000.0),
    }


def add_fractions(run: dict, limits: dict) -> dict:
    run["decode_bandwidth_fraction"] = run.pop("_bytes_per_s") / limits["copy_bandwidth_bytes_per_s"]
    run["prefill_flops_fraction"] = run.pop("_flops_per_s") / limits["peak_flops"]
    return run


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    import torch
    import transformers

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("peer_torch: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    torch.manual_seed(args.seed)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    info(f"torch {torch.__version__}, transformers {transformers.__version__}, device {gpu or 'cpu'}")

    with torch.inference_mode():
        config = build_config(args.shape, args.prompt_tokens + args.gen_tokens)
        t0 = time.perf_counter()
        model = build_model(torch, config, device)
        params = sum(p.numel() for p in model.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        info(
            f"{args.shape}: {params / 1e6:.1f} M params, {weight_bytes / GIB:.2f} GiB bf16, built in "
            f"{time.perf_counter() - t0:.1f} s; attention {config._attn_implementation}; mode {args.mode}"
        )
        sizes = {"params": params, "weight_bytes": weight_bytes}

        runs = []
        for batch in args.batches:
            run = bench_batch(torch, model, config, args, batch, device, sync, sizes)
            if run is not None:
                runs.append(run)
        del model
        free_device_memory(torch, device)

        # The limits last, with the model gone: their buffers then count in no run's peak memory.
        copy_bw, copy_src = measure_copy_bandwidth(torch, device, sync)
        peak, peak_src = measure_peak_flops(torch, device, sync)
        info(f"copy bandwidth {copy_bw / 1e9:.1f} GB/s ({copy_src}); peak {peak / 1e12:.2f} TFLOP/s ({peak_src})")
        limits = {
            "copy_bandwidth_bytes_per_s": copy_bw,
            "copy_bandwidth_source": copy_src,
            "peak_flops": peak,
            "peak_flops_source": peak_src,
        }
        runs = [add_fractions(run, limits) for run in runs]

    result = {
        "schema": SCHEMA_ID,
        "tool": f"transformers-{args.mode}",
        "date": date,
        "machine": {
            "host": socket.gethostname(),
            "cpu": cpu_name(),
            "cores": cores(),
            "os": platform.system().lower(),
            "gpu": gpu,
        },
        "backend": {
            "name": device.type,
            "device": gpu if gpu is not None else cpu_name(),
            "kind": "discrete_gpu" if device.type == "cuda" else "cpu",
        },
        "model": {
            "name": args.shape,
            "source": f"synthetic:{args.shape}",
            "dtype": "bf16",
            "params": params,
            "weight_bytes": weight_bytes,
            "synthetic": True,
        },
        "settings": {
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "repeat": args.repeat,
            "warmup": args.warmup,
            "batch": args.batches,
        },
        "limits": limits,
        "runs": runs,
    }
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    info(f"wrote {args.out} ({len(runs)} of {len(args.batches)} batch sizes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
