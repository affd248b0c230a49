"""engine serve through the official `openai` Python client, on the default model.

Run by scripts/test-openai.sh (which makes the virtualenv): starts `engine serve` on a free
loopback port (port 0; the address is read from its stderr), then checks chat and completion,
streamed and whole, against `engine run --temperature 0`, and the client's error types for a
bad key and a bad request. Prints 'N passed, N failed'.

usage: client_test.py ENGINE PLUGIN_DIR MODEL
"""

import json
import re
import subprocess
import sys
import traceback

import openai

ENGINE, PLUGIN_DIR, MODEL = sys.argv[1:4]
KEY = "test-key-123"
CONTEXT = "1024"
COMMON = ["--model", MODEL, "--backend", "cpu", "--plugin-dir", PLUGIN_DIR, "--context", CONTEXT]


def start_server():
    p = subprocess.Popen(
        [ENGINE, "serve", *COMMON, "--port", "0", "--parallel", "2", "--api-key", KEY],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in p.stderr:
        lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return p, m.group(1)
    p.wait()
    raise RuntimeError("engine serve did not start:\n" + "".join(lines))


def engine_run(prompt, max_tokens):
    out = subprocess.run(
        [ENGINE, "run", *COMMON, "--prompt", prompt, "--max-tokens", str(max_tokens),
         "--temperature", "0", "--json"],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


server, url = start_server()
client = openai.OpenAI(api_key=KEY, base_url=url + "/v1", max_retries=0, timeout=300)
results = []


def check(name):
    def wrap(f):
        try:
            f()
            results.append((name, None))
            print(f"ok   {name}", flush=True)
        except Exception:  # report every failure, keep going
            results.append((name, traceback.format_exc()))
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        return f
    return wrap


PROMPT = "The capital of France is"


@check("models")
def _():
    ids = [m.id for m in client.models.list()]
    assert ids == ["gemma-3-270m-q4_k_m"], ids


@check("greedy completion equals engine run --temperature 0")
def _():
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0)
    run = engine_run(PROMPT, 24)
    assert r.choices[0].text == run["text"], (r.choices[0].text, run["text"])
    assert r.choices[0].finish_reason == run["finish_reason"]
    assert r.usage.prompt_tokens == len(run["prompt_tokens"]), r.usage
    assert r.usage.completion_tokens == len(run["tokens"]), r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@check("streamed completion equals engine run --temperature 0")
def _():
    chunks = list(client.completions.create(
        model="m", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == engine_run(PROMPT, 24)["text"], text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"] or finishes == ["stop"], finishes
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


@check("chat, whole and streamed, agree")
def _():
    messages = [{"role": "user", "content": "Name one colour."}]
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=32, temperature=0)
    whole = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"
    assert whole.strip(), r
    assert r.choices[0].finish_reason in ("stop", "length")
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=messages, max_tokens=32, temperature=0, stream=True) if c.choices]
    assert "".join(parts) == whole, ("".join(parts), whole)


@check("chat on the base default model: the client keeps tandem's warning field as an extra")
def _():
    messages = [{"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    warning = (r.model_extra or {}).get("warning", "")
    assert "tokenizer.chat_template" in warning or "base checkpoint" in warning, r


@check("seeded sampling is reproducible")
def _():
    a = client.completions.create(model="m", prompt=PROMPT, max_tokens=16, seed=5, temperature=1)
    b = client.completions.create(model="m", prompt=PROMPT, max_tokens=16, seed=5, temperature=1)
    assert a.choices[0].text == b.choices[0].text


@check("a wrong key is AuthenticationError (401)")
def _():
    bad = openai.OpenAI(api_key="wrong", base_url=url + "/v1", max_retries=0)
    try:
        bad.completions.create(model="m", prompt="x", max_tokens=1)
    except openai.AuthenticationError as e:
        assert e.status_code == 401
    else:
        raise AssertionError("no error")


@check("max_tokens 0 is BadRequestError (400) naming the field")
def _():
    try:
        client.completions.create(model="m", prompt="x", max_tokens=0)
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert e.body["param"] == "max_tokens", e.body
    else:
        raise AssertionError("no error")


server.terminate()
code = server.wait(timeout=60)
if code != 0:
    results.append(("exit status after SIGTERM", f"{code}"))
failed = sum(1 for _, e in results if e)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
