"""Regenerates the dequantisation test vectors in quant/ (run from this directory).

Needs the `gguf` and `numpy` packages from PyPI (`pip install gguf numpy`). For every storage type
it writes `<type>.blocks` (raw ggml blocks, little-endian) and `<type>.f32` (what
`gguf.quants.dequantize` decodes them to, as little-endian f32). The legacy block types get two
blocks quantized from random data by `gguf.quants.quantize` plus one block of random bytes; the
k-quants (which the package can only decode) get two blocks of random bytes. Every f16 scale in a
random block is a finite value (normal, subnormal, zero or negative), never an infinity or NaN.
tandem_backend_api::quant's tests load these files and compare bit for bit.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize, dequantize

rng = np.random.default_rng(20250601)

# Byte offsets of the f16 fields in each block layout.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
BLOCK = {
    T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22), T.Q5_1: (32, 24), T.Q8_0: (32, 34),
    T.Q2_K: (256, 84), T.Q3_K: (256, 110), T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210),
}
NAMES = {
    T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q8_0: "q8_0",
    T.Q2_K: "q2_k", T.Q3_K: "q3_k", T.Q4_K: "q4_k", T.Q5_K: "q5_k", T.Q6_K: "q6_k",
}


def random_scale(i):
    choices = [
        np.float16(rng.normal() * 0.05),
        np.float16(-abs(rng.normal()) * 0.02),
        np.float16(3.0e-6),  # subnormal in f16
        np.float16(0.0),
        np.float16(rng.normal() * 4.0),
    ]
    return choices[i % len(choices)]


def random_blocks(qt, n):
    _, size = BLOCK[qt]
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for b in range(n):
        for k, off in enumerate(F16_FIELDS[qt]):
            raw[b, off:off + 2] = np.array([random_scale(b * 3 + k + 1)]).view(np.uint8)
    return raw.reshape(-1)


def write(name, blocks, values):
    assert values.dtype == np.float32
    blocks.astype(np.uint8).tofile(f"quant/{name}.blocks")
    values.astype("<f4").tofile(f"quant/{name}.f32")


for qt in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
    elems, _ = BLOCK[qt]
    data = (rng.normal(size=2 * elems) * 0.7).astype(np.float32)
    data[3] = 0.0
    q = quantize(data.reshape(1, -1), qt).reshape(-1)
    blocks = np.concatenate([q, random_blocks(qt, 1)])
    write(NAMES[qt], blocks, dequantize(blocks.reshape(1, -1), qt).reshape(-1))

for qt in [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
    blocks = random_blocks(qt, 2)
    write(NAMES[qt], blocks, dequantize(blocks.reshape(1, -1), qt).reshape(-1))

f32 = np.array([0.0, -0.0, 1.0, -2.5, 1e-40, np.inf, -np.inf, 3.4e38, 1.17549435e-38, 0.1,
                -7.25, 65504.0, 1e-7, 123456.789, -1e30, 42.0], dtype=np.float32)
write("f32", f32.view(np.uint8), f32)

f16_bits = np.concatenate([
    np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0x7C00, 0xFC00,
              0x8001, 0x3555, 0xC000, 0x5640, 0x1234, 0xABCD], dtype=np.uint16),
    rng.integers(0, 0x7C00, size=48, dtype=np.uint16) | (rng.integers(0, 2, size=48, dtype=np.uint16) << 15),
])
write("f16", f16_bits.view(np.uint8), dequantize(f16_bits.view(np.float16), T.F16).reshape(-1))

bf16_bits = np.concatenate([
    np.array([0x0000, 0x8000, 0x0001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0x7F80, 0xFF80,
              0x7FC0, 0x7F81, 0xFFC1, 0x4049, 0x1234, 0xABCD], dtype=np.uint16),
    rng.integers(0, 0x10000, size=48, dtype=np.uint16),
])
write("bf16", bf16_bits.view(np.uint8), dequantize(bf16_bits.view(np.uint8).reshape(1, -1), T.BF16).reshape(-1))
