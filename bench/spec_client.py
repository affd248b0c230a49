#!/usr/bin/env python3
"""bench/spec_client.py: one client for tandem's `engine serve` and `llama-server` alike, for
speculative decoding's comparison (bench/speculative-vs-llamacpp.sh).

For one server: a warm-up request with the first prompt file, then one greedy streamed request
of MAX_TOKENS through /v1/completions per other prompt file, each a different passage (a
server that remembers earlier replies, as llama-server's `ngram-mod` does, gains nothing from
having seen the same request before). Each request's decode rate is (tokens - 1) / (time of the
last chunk - time of the first), its tokens the `usage` of the stream's last chunk
(`stream_options.include_usage`). Prints one JSON document with each reply's text, so that
runs can be compared.

usage: spec_client.py URL MAX_TOKENS LABEL WARMUP_FILE PROMPT_FILE...
"""
import json
import sys
import time
import urllib.request


def streamed(url, doc):
    """Time of the request, of the first and last content chunk, the text and the usage."""
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(dict(doc, stream=True, stream_options={"include_usage": True})).encode(),
        headers={"Content-Type": "application/json"},
    )
    first = last = usage = None
    text = []
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            piece = "".join(c.get("text", "") for c in chunk.get("choices", []))
            if piece:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                text.append(piece)
    return start, first, last, "".join(text), usage


def main():
    url, max_tokens, label, warmup, *prompts = sys.argv[1:]
    doc = {"max_tokens": int(max_tokens), "temperature": 0, "seed": 0}
    streamed(url, dict(doc, prompt=open(warmup).read()))
    runs = []
    for f in prompts:
        start, first, last, text, usage = streamed(url, dict(doc, prompt=open(f).read()))
        tokens = (usage or {}).get("completion_tokens", 0)
        span = (last - first) if first is not None and last is not None else 0.0
        runs.append(
            {
                "prompt": f,
                "completion_tokens": tokens,
                "ttft_s": (first - start) if first is not None else None,
                "decode_s": span,
                "decode_tokens_per_second": (tokens - 1) / span if span > 0 else None,
                "text": text,
            }
        )
    tokens = sum(r["completion_tokens"] - 1 for r in runs)
    seconds = sum(r["decode_s"] for r in runs)
    print(
        json.dumps(
            {
                "label": label,
                "runs": runs,
                "decode_tokens_per_second": tokens / seconds if seconds > 0 else None,
            }
        )
    )


if __name__ == "__main__":
    main()
