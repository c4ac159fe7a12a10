#!/usr/bin/env python3
"""An independent safetensors reader for zinf's interop test.

Uses only the standard library (json, struct, zlib) and numpy; no
safetensors package. For every tensor of every file given on the command
line it prints one JSON line:

  {"file", "name", "dtype", "shape", "crc32_raw", "crc32_f32", "sum",
   "first", "metadata"}

crc32_raw is zlib's CRC-32 (IEEE) of the tensor's bytes as stored;
crc32_f32 is the CRC-32 of the values converted to little-endian float32
(bf16: the uint16 shifted left by 16 and viewed as float32; f16: numpy's
float16 -> float32); sum is the float64 sum of those values; first holds up
to 4 of them. It exits non-zero if a file breaks the format: a header that
is not a JSON object, an unknown dtype, a size that does not match the
shape, data offsets that leave gaps, overlap or do not end at the end of
the file.
"""
import json
import struct
import sys
import zlib

import numpy as np

DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


def fail(path, msg):
    print(f"{path}: {msg}", file=sys.stderr)
    sys.exit(1)


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail(path, "shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail(path, f"header length {n} runs past the end")
    if (8 + n) % 8 != 0:
        fail(path, f"data does not start at a multiple of 8 ({8 + n})")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        fail(path, "header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        fail(path, "__metadata__ is not a string map")
    body = memoryview(data)[8 + n :]
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], name) for name, info in header.items())
    end = 0
    for lo, hi, name in spans:
        if lo != end:
            fail(path, f"tensor {name}: starts at {lo}, expected {end}")
        end = hi
    if end != len(body):
        fail(path, f"tensors end at {end}, the data section has {len(body)} bytes")
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in DTYPES:
            fail(path, f"tensor {name}: unknown dtype {dtype}")
        np_dtype, size = DTYPES[dtype]
        lo, hi = info["data_offsets"]
        shape = info["shape"]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if hi - lo != count * size:
            fail(path, f"tensor {name}: {hi - lo} bytes for shape {shape} of {dtype}")
        raw = bytes(body[lo:hi])
        arr = np.frombuffer(raw, dtype=np_dtype)
        if dtype == "BF16":
            f32 = (arr.astype(np.uint32) << 16).view(np.float32)
        else:
            f32 = arr.astype(np.float32)
        f32 = f32.reshape(shape)
        flat = f32.reshape(-1)
        print(
            json.dumps(
                {
                    "file": path.rsplit("/", 1)[-1],
                    "name": name,
                    "dtype": dtype,
                    "shape": shape,
                    "crc32_raw": zlib.crc32(raw) & 0xFFFFFFFF,
                    "crc32_f32": zlib.crc32(flat.astype("<f4").tobytes()) & 0xFFFFFFFF,
                    "sum": float(flat.astype(np.float64).sum()),
                    "first": [float(v) for v in flat[:4]],
                    "metadata": meta,
                }
            )
        )


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    for path in sys.argv[1:]:
        read_file(path)


if __name__ == "__main__":
    main()
