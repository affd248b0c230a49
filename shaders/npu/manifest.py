#!/usr/bin/env python3
"""Write manifest.json for a directory of built NPU artefacts (format 1).

Usage (build.sh calls this):
  manifest.py --dir DIR --generation npu4 --mlir-aie VER --peano VER \
      --max-context 32768 NAME:PHASE:HEAD_DIM:GROUP:Q_BLOCK ...

Each NAME must have NAME.xclbin and NAME.insts.bin in DIR. The field names
are read by tandem's NPU backend; see CONTRACT.md "Artefact manifest".
Standard library only.
"""
import argparse
import hashlib
import json
import os
import sys

GENERATIONS = ("npu1", "npu4", "npu5", "npu6")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--generation", required=True, choices=GENERATIONS)
    ap.add_argument("--mlir-aie", required=True)
    ap.add_argument("--peano", required=True)
    ap.add_argument("--max-context", type=int, required=True)
    ap.add_argument("--kernel-name", default="MLIR_AIE")
    ap.add_argument("entries", nargs="+")
    a = ap.parse_args()

    kernels = []
    for e in a.entries:
        try:
            name, phase, d, g, qb = e.split(":")
            d, g, qb = int(d), int(g), int(qb)
        except ValueError:
            sys.exit(f"manifest.py: bad entry {e!r}")
        if phase not in ("decode", "prefill"):
            sys.exit(f"manifest.py: bad phase in {e!r}")
        if qb != (1 if phase == "decode" else 32):
            sys.exit(f"manifest.py: q_block must be 1 (decode) or 32 (prefill): {e!r}")
        xclbin, insts = f"{name}.xclbin", f"{name}.insts.bin"
        for f in (xclbin, insts):
            if not os.path.isfile(os.path.join(a.dir, f)):
                sys.exit(f"manifest.py: missing {f} in {a.dir}")
        kernels.append({
            "name": name,
            "phase": phase,
            "head_dim": d,
            "group": g,
            "q_block": qb,
            "kv_block": 128,
            "max_context": a.max_context,
            "xclbin": xclbin,
            "kernel": a.kernel_name,
            "instructions": insts,
            "sha256": {
                "xclbin": sha256(os.path.join(a.dir, xclbin)),
                "instructions": sha256(os.path.join(a.dir, insts)),
            },
        })
    manifest = {
        "format": 1,
        "abi": 1,
        "generation": a.generation,
        "toolchain": {"mlir_aie": a.mlir_aie, "peano": a.peano},
        "kernels": kernels,
    }
    path = os.path.join(a.dir, "manifest.json")
    with open(path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {path} ({len(kernels)} kernels)")


if __name__ == "__main__":
    main()
