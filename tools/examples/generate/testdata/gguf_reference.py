#!/usr/bin/env python3
"""Reference values for the GGUF reader's test on the real SmolLM2 file (gguf.rs,
`real_smollm2_file`).

Usage: python3 gguf_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
Needs: pip install gguf numpy   (produced with gguf 0.19.0, numpy 2.4)

For each tensor it prints Rust source for one `Reference` entry: the ggml type, the dims in
GGUF order (innermost first), the sum and the sum of squares of all dequantized values
(accumulated in float64) and the first and last four values (float32, printed as the
shortest decimal that round-trips in float32). The output is pasted into REFERENCES
in gguf.rs; the Rust test recomputes every number with its own reader.
"""
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

TENSORS = [
    "token_embd.weight",  # Q8_0
    "blk.0.attn_q.weight",  # Q4_1
    "blk.0.ffn_down.weight",  # Q4_1, not square
    "blk.29.attn_v.weight",  # Q4_1, last layer
    "blk.0.attn_norm.weight",  # F32
    "output_norm.weight",  # F32
]

here = os.path.dirname(os.path.abspath(__file__))
default = os.path.join(here, "..", "..", "..", "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("POLYATTN_SMOLLM2_GGUF", default)
reader = GGUFReader(path)
by_name = {t.name: t for t in reader.tensors}


def f32(x):
    # numpy's str() of a float32 is the shortest decimal that round-trips in float32.
    r = str(np.float32(x))
    return r if ("." in r or "e" in r) else r + ".0"


for name in TENSORS:
    t = by_name[name]
    # gguf-py gives numpy arrays with the dims reversed (outermost first); flattening in
    # C order therefore yields the GGUF layout with dims[0] contiguous.
    x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
    dims = [int(d) for d in t.shape]
    assert x.size == int(np.prod(dims))
    x64 = x.astype(np.float64)
    print("    Reference {")
    print(f"        name: {name!r},".replace("'", '"'))
    print(f"        ggml_type: GgmlType::{t.tensor_type.name},")
    print(f"        dims: &{dims},")
    print(f"        sum: {float(x64.sum())!r},")
    print(f"        sum_sq: {float((x64 * x64).sum())!r},")
    print(f"        first: [{', '.join(f32(v) for v in x[:4])}],")
    print(f"        last: [{', '.join(f32(v) for v in x[-4:])}],")
    print("    },")
