#!/usr/bin/env python3
"""Start-up time of `engine serve` beside llama.cpp's `llama-server` on the same GGUF file.

Each start is timed from the process's launch to the first `GET /health` answered 200 (both
servers answer it only once they can serve: tandem after its warm-up steps, llama-server after
loading), then one short completion is asked to show it serves, and the server is stopped.

Cases (every one with the NVIDIA driver's own shader disk cache off, `__GL_SHADER_DISK_CACHE=0`,
unless named "driver cache", so that what is measured is the engine's own work):
  tandem cold           a fresh TANDEM_CACHE_DIR: no pipeline cache file yet
  tandem second         the same directory again: pipelines from tandem's on-disk cache
  tandem cache off      TANDEM_PIPELINE_CACHE=0 (a sanity check: as cold)
  llama-server cold     llama.cpp has no pipeline cache of its own
  llama-server second   the same again
  * driver cache        both engines again with the driver's disk cache on in a fresh folder,
                        first to fill it, then timed

Usage: cold_start.py --engine E --llama-server L --model M --out OUT.json [--parallel N]
Writes OUT.json: {"cases": [{"engine", "case", "seconds", "stderr_tail"}...], ...}.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return None


def complete(port: int) -> str:
    doc = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["text"]


def start(argv, env, port, limit=300.0):
    """Seconds from launch to /health 200, the completion's text and stderr's tail."""
    log = tempfile.TemporaryFile()
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
    seconds = None
    try:
        while time.monotonic() - t0 < limit:
            if p.poll() is not None:
                break
            if get(f"http://127.0.0.1:{port}/health", 1.0) == 200:
                seconds = time.monotonic() - t0
                break
            time.sleep(0.05)
        text = complete(port) if seconds is not None else None
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    log.seek(0)
    tail = log.read().decode(errors="replace").splitlines()[-12:]
    return seconds, text, tail


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--backend", default="vulkan")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="cold-start-")
    base = dict(os.environ, __GL_SHADER_DISK_CACHE="0", TANDEM_PIPELINE_CACHE="log")
    cases = []

    def tandem(case, env):
        port = free_port()
        argv = [a.engine, "serve", "--model", a.model, "--backend", a.backend,
                "--parallel", str(a.parallel), "--port", str(port)]
        s, text, tail = start(argv, env, port)
        cases.append({"engine": "tandem", "case": case, "seconds": s, "text": text,
                      "stderr_tail": tail})
        print(f"tandem {case}: {s if s is None else round(s, 2)} s", flush=True)

    def llama(case, env):
        if not a.llama_server:
            return
        port = free_port()
        argv = [a.llama_server, "-m", a.model, "-ngl", "99", "-fa", "on",
                "-np", str(a.parallel), "-c", str(4096 * a.parallel), "--port", str(port)]
        s, text, tail = start(argv, env, port)
        cases.append({"engine": "llama-server", "case": case, "seconds": s, "text": text,
                      "stderr_tail": tail})
        print(f"llama-server {case}: {s if s is None else round(s, 2)} s", flush=True)

    own = os.path.join(work, "tandem-cache")
    tandem("cold", dict(base, TANDEM_CACHE_DIR=own))
    tandem("second", dict(base, TANDEM_CACHE_DIR=own))
    tandem("cache off", dict(base, TANDEM_CACHE_DIR=own, TANDEM_PIPELINE_CACHE="0"))
    llama("cold", base)
    llama("second", base)
    # The driver's own disk cache on, in fresh folders: filled by a first start, then timed.
    for engine, run in (("tandem", tandem), ("llama-server", llama)):
        drv = os.path.join(work, f"driver-{engine}")
        os.makedirs(drv, exist_ok=True)
        env = dict(base, __GL_SHADER_DISK_CACHE="1", __GL_SHADER_DISK_CACHE_PATH=drv,
                   __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1",
                   TANDEM_CACHE_DIR=os.path.join(work, f"tandem-{engine}"),
                   TANDEM_PIPELINE_CACHE="0")
        run("driver cache, first", env)
        run("driver cache, second", env)

    doc = {"model": a.model, "parallel": a.parallel, "backend": a.backend, "cases": cases}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
