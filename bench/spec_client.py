#!/usr/bin/env python3
"""bench/spec_client.py: one client for tandem's `engine serve` and `llama-server` alike, for
speculative decoding's comparison (bench/speculative-vs-llamacpp.sh).

For one server and one prompt file: a warm-up request, then REPEAT greedy streamed requests of
MAX_TOKENS through /v1/completions. Each run's decode rate is (tokens - 1) / (time of the last
chunk - time of the first), the tokens counted by a non-streamed request of the same settings
(greedy: the same text) from its `usage`; the text is kept so that runs can be compared. Prints
one JSON document.

usage: spec_client.py URL PROMPT_FILE MAX_TOKENS REPEAT LABEL
"""
import json
import sys
import time
import urllib.request


def post(url, doc, stream):
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json"},
    )
    return urllib.request.urlopen(req, timeout=600)


def streamed(url, doc):
    """Time of the first and last content chunk, and the text."""
    first = last = None
    text = []
    start = time.perf_counter()
    with post(url, dict(doc, stream=True), True) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            piece = "".join(c.get("text", "") for c in chunk.get("choices", []))
            if piece:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                text.append(piece)
    return start, first, last, "".join(text)


def main():
    url, prompt_file, max_tokens, repeat, label = sys.argv[1:6]
    prompt = open(prompt_file).read()
    doc = {"prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0, "seed": 0}
    # Warm-up, and the token count of the (greedy, so fixed) reply.
    with post(url, doc, False) as r:
        whole = json.load(r)
    tokens = whole["usage"]["completion_tokens"]
    runs = []
    for _ in range(int(repeat)):
        start, first, last, text = streamed(url, doc)
        span = (last - first) if first is not None and last is not None else 0.0
        runs.append(
            {
                "ttft_s": (first - start) if first is not None else None,
                "decode_s": span,
                "decode_tokens_per_second": (tokens - 1) / span if span > 0 else None,
                "same_text": text == whole["choices"][0]["text"],
            }
        )
    rates = sorted(r["decode_tokens_per_second"] or 0.0 for r in runs)
    print(
        json.dumps(
            {
                "label": label,
                "completion_tokens": tokens,
                "text": whole["choices"][0]["text"],
                "runs": runs,
                "median_decode_tokens_per_second": rates[len(rates) // 2],
            }
        )
    )


if __name__ == "__main__":
    main()
