"""Regenerates the seed corpus of engine/tests/fuzz_parsers.rs (run from this directory).

Standard library only. Writes small valid GGUF and safetensors files, and a few invalid ones that
sit just past a check of the parsers (a count, a length, an offset, a type id), into gguf/ and
safetensors/. gguf/tiny.gguf is a copy of ../data/gguf/tiny.gguf, the file the reference Python
writer produced. The fuzz tests mutate every seed, valid or not; the corpus test opens each one
and reads every tensor.
"""

import json
import os
import random
import struct

rng = random.Random(20240611)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def gstr(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return u64(len(b)) + b


# GGUF value type ids.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def gvalue(ty, v):
    if ty == STRING:
        return gstr(v)
    if ty == ARRAY:
        elem_ty, elems = v
        out = u32(elem_ty) + u64(len(elems))
        for e in elems:
            out += gvalue(elem_ty, e)
        return out
    return struct.pack(SCALAR[ty], v)


# ggml type id: (block elements, block bytes).
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
        10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
        30: (1, 2)}


def gguf(metadata, tensors, version=3, alignment=32):
    """metadata: [(key, type, value)]; tensors: [(name, dims innermost first, ggml type)]."""
    head = b"GGUF" + u32(version) + u64(len(tensors)) + u64(len(metadata))
    for key, ty, v in metadata:
        head += gstr(key) + u32(ty) + gvalue(ty, v)
    data = b""
    for name, dims, ty in tensors:
        data += b"\0" * (-len(data) % alignment)
        head += gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(ty)
        head += u64(len(data))
        numel = 1
        for d in dims:
            numel *= d
        block_elems, block_bytes = GGML.get(ty, (1, 4))
        data += bytes(rng.randrange(256) for _ in range(numel // block_elems * block_bytes))
    head += b"\0" * (-len(head) % alignment)
    return head + data


def safetensors(entries, metadata=None, pad_to=8):
    """entries: [(name, dtype, shape, raw bytes)], laid out in order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % pad_to)
    return u64(len(text)) + text + data


def st_raw_header(text, data=b""):
    return u64(len(text)) + text + data


def f32s(*v):
    return struct.pack(f"<{len(v)}f", *v)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# GGUF seeds: valid.
write("gguf/tiny.gguf", open("../data/gguf/tiny.gguf", "rb").read())
write("gguf/empty-v2.gguf", gguf([], [], version=2))
every_value = [
    ("general.architecture", STRING, "gemma3"),
    ("v.u8", U8, 200), ("v.i8", I8, -100), ("v.u16", U16, 60000), ("v.i16", I16, -30000),
    ("v.u32", U32, 4000000000), ("v.i32", I32, -2000000000), ("v.f32", F32, 1.5),
    ("v.bool", BOOL, 1), ("v.string", STRING, "h\u00e9llo"), ("v.u64", U64, 1 << 40),
    ("v.i64", I64, -(1 << 40)), ("v.f64", F64, 2.5),
    ("a.u8", ARRAY, (U8, [1, 2, 3])), ("a.bool", ARRAY, (BOOL, [0, 1])),
    ("a.i32", ARRAY, (I32, [-1, 2])), ("a.f32", ARRAY, (F32, [0.5, -0.25])),
    ("a.u64", ARRAY, (U64, [7])), ("a.string", ARRAY, (STRING, ["", "a", "\u2581b"])),
    ("a.empty", ARRAY, (F64, [])),
    ("a.nested", ARRAY, (ARRAY, [(U16, [1, 2]), (STRING, ["x"]), (ARRAY, [(I8, [-1])])])),
]
write("gguf/every-type.gguf", gguf(every_value, [
    ("f32", [3, 2], 0), ("f16", [4], 1), ("bf16", [2, 1, 1, 1], 30), ("scalar", [], 0),
    ("empty", [0, 3], 0), ("q4_0", [32], 2), ("q4_1", [32], 3), ("q5_0", [32], 6),
    ("q5_1", [32], 7), ("q8_0", [32, 2], 8), ("q2_k", [256], 10), ("q3_k", [256], 11),
    ("q4_k", [256], 12), ("q5_k", [256], 13), ("q6_k", [256], 14),
]))
write("gguf/align-8.gguf", gguf(
    [("general.alignment", U32, 8), ("general.architecture", STRING, "gemma3")],
    [("token_embd.weight", [2, 3], 0), ("output_norm.weight", [3], 1)], alignment=8))
# One empty tensor and nothing else: the fields a mutation most needs to hit are few.
write("gguf/one-empty-tensor.gguf", gguf([], [("t", [0, 1, 1], 0)], version=2))

# GGUF seeds: invalid, each just past one check.
tiny = open("../data/gguf/tiny.gguf", "rb").read()
write("gguf/bad-magic.gguf", b"GGUG" + tiny[4:])
write("gguf/version-1.gguf", tiny[:4] + u32(1) + tiny[8:])
write("gguf/big-endian.gguf", tiny[:4] + struct.pack(">I", 3) + tiny[8:])
write("gguf/truncated.gguf", tiny[: len(tiny) - 100])
write("gguf/header-only-5-bytes.gguf", tiny[:5])
write("gguf/tensor-count-overflow.gguf", tiny[:8] + u64(1 << 62) + tiny[16:])
write("gguf/string-past-end.gguf",
      b"GGUF" + u32(3) + u64(0) + u64(1) + gstr("general.architecture") + u32(STRING)
      + u64(1 << 40) + b"gemma3")
write("gguf/unknown-ggml-type.gguf", gguf([], [("t", [4], 99)]))
write("gguf/array-too-deep.gguf", gguf(
    [("deep", ARRAY, (ARRAY, [(ARRAY, [(ARRAY, [(ARRAY, [(ARRAY, [(ARRAY, [(ARRAY, [(ARRAY, [
        (U8, [1])])])])])])])])]))], []))
write("gguf/misaligned-offset.gguf",
      b"GGUF" + u32(3) + u64(1) + u64(0) + gstr("t") + u32(1) + u64(1) + u32(0) + u64(4)
      + b"\0" * 64)
# Dimensions whose product is 0 but whose nonzero part overflows 64 bits.
write("gguf/empty-dims-overflow.gguf", gguf([], [("t", [0, 1, 1], 0)])
      .replace(u64(0) + u64(1) + u64(1), u64(0) + u64(1 << 33) + u64(1 << 33)))

# safetensors seeds: valid.
write("safetensors/three-dtypes.safetensors", safetensors([
    ("a.f32", "F32", [2, 3], f32s(1, 2, 3, -4, 0.5, 1e30)),
    ("b.f16", "F16", [4], struct.pack("<4e", 1.0, -2.0, 65504.0, 0.0)),
    ("c.bf16", "BF16", [2, 2], bytes([0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40, 0x00, 0x00])),
], metadata={"format": "pt"}))
write("safetensors/empty.safetensors", st_raw_header(b"{}"))
write("safetensors/other-dtypes.safetensors", safetensors([
    ("i64", "I64", [2], u64(1) + u64(2)),
    ("u8", "U8", [3], b"\1\2\3"),
    ("scalar", "F32", [], f32s(7)),
    ("empty", "F32", [0, 4], b""),
    ("f4", "F4", [8], b"\x12\x34\x56\x78"),
    ("bool", "BOOL", [2], b"\0\1"),
]))

# safetensors seeds: invalid.
good = safetensors([("a", "F32", [2], f32s(1, 2))])
write("safetensors/too-short.safetensors", b"\x05\0\0\0\0")
write("safetensors/header-too-large.safetensors", u64(1 << 60) + good[8:])
write("safetensors/header-past-end.safetensors", u64(len(good)) + good[8:])
write("safetensors/not-json.safetensors", st_raw_header(b"{\"a\": [1, 2", f32s(1, 2)))
write("safetensors/not-an-object.safetensors", st_raw_header(b"[1,2,3]"))
write("safetensors/overlap.safetensors", st_raw_header(json.dumps({
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
}).encode(), f32s(1, 2, 3)))
write("safetensors/size-mismatch.safetensors", st_raw_header(json.dumps({
    "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
}).encode(), f32s(1, 2)))
write("safetensors/offsets-out-of-order.safetensors", st_raw_header(json.dumps({
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]},
}).encode(), f32s(1, 2)))
write("safetensors/data-past-end.safetensors", st_raw_header(json.dumps({
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551615]},
}).encode(), f32s(1, 2)))
write("safetensors/huge-shape.safetensors", st_raw_header(json.dumps({
    "a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [4294967296, 4294967296, 0], "data_offsets": [8, 8]},
    "c": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [8, 8]},
}).encode(), f32s(1, 2)))
write("safetensors/bad-entries.safetensors", st_raw_header(json.dumps({
    "a": {"dtype": 5, "shape": [-1], "data_offsets": [0]},
}).encode(), f32s(1, 2)))
