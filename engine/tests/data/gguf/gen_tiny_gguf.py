"""Regenerates tiny.gguf, a GGUF v3 file written by the reference Python writer (run from this
directory after gen_quant_vectors.py).

Needs the `gguf` and `numpy` packages from PyPI. tandem_engine::gguf's tests open the file and
check every metadata value and tensor listed here; the q8_0 and q4_k tensors hold the blocks of
quant/q8_0.blocks and quant/q4_k.blocks, so their decoding is quant/q8_0.f32 and quant/q4_k.f32.
"""

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType as T

w = GGUFWriter("tiny.gguf", "gemma3")
w.add_uint32("gemma3.block_count", 2)
w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
w.add_bool("tiny.flag", True)
w.add_int32("tiny.negative", -7)
w.add_uint64("tiny.big", 1 << 40)
w.add_float64("tiny.pi", 3.141592653589793)
w.add_string("tiny.unicode", "Gemma \u00e9\u4e2d")
w.add_array("tokenizer.ggml.tokens", ["<pad>", "<eos>", "<bos>", "\u2581hi"])
w.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.25])
w.add_array("tiny.ints", [1, -2, 3])
w.add_custom_alignment(64)

w.add_tensor("token_embd.weight", np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5)
w.add_tensor("output_norm.weight", np.array([1.0, -0.5, 65504.0, 0.0], dtype=np.float16))
q8 = np.fromfile("quant/q8_0.blocks", dtype=np.uint8)
w.add_tensor("blk.0.ffn_up.weight", q8.reshape(3, 34), raw_dtype=T.Q8_0)
q4k = np.fromfile("quant/q4_k.blocks", dtype=np.uint8)
w.add_tensor("blk.0.ffn_down.weight", q4k.reshape(2, 144), raw_dtype=T.Q4_K)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
