"""Minimal safetensors writer and reader on numpy (no torch, no safetensors package), for the LLaMA golden
scripts: writes the header as the format requires (JSON padded with spaces to a multiple of 8 bytes, data
offsets relative to the data section)."""
import json
import struct

import numpy as np

_DTYPES = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("int64"): "I64",
           np.dtype("int32"): "I32"}
_NUMPY = {v: k for k, v in _DTYPES.items()}


def save(path, tensors, metadata=None):
    """tensors: dict name -> numpy array (f64, f32, i64, i32), written in C order, little-endian."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        data = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=_NUMPY[info["dtype"]]).reshape(info["shape"])
    return out
