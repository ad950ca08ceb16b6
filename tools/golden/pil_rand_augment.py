#!/usr/bin/env python3
"""Fixture for tests/cpu/test_golden_rand_augment.cpp: RandAugment's image operations (data/image_ops.h) against
Pillow, which timm's RandAugment calls and torchvision's RandAugment calls too on the PIL images of its
classification recipe. Needs only numpy and Pillow (Debian's python3-pil and python3-numpy will do):

    python3 tools/golden/pil_rand_augment.py tests/fixtures

It writes rand_augment_pil.safetensors (about 23 kB): "in", a 13x11 RGB image (HWC u8; channel 1 has a narrow
range so autocontrast and equalize do something), and one HWC u8 tensor per case, named as the C++ test
expects, with the Pillow version in the metadata.
"""
import json
import struct
import sys

import numpy as np
import PIL
from PIL import Image, ImageEnhance, ImageOps


def save_u8_safetensors(path, tensors, metadata):
    """The safetensors format by hand (no torch here): u64 header length, JSON header, raw data."""
    header, data, offset = {"__metadata__": metadata}, b"", 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype=np.uint8).tobytes()
        header[name] = {"dtype": "U8", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def main(out_dir):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=(13, 11, 3), dtype=np.uint8)
    a[:, :, 1] = a[:, :, 1] // 3 + 60
    im = Image.fromarray(a)
    out = {"in": im}
    out["autocontrast"] = ImageOps.autocontrast(im)
    out["equalize"] = ImageOps.equalize(im)
    out["invert"] = ImageOps.invert(im)
    for bits in (1, 3, 7):
        out[f"posterize_{bits}"] = ImageOps.posterize(im, bits)
    for t in (26, 100, 178.5):  # 178.5: torchvision's threshold at magnitude 9 of 31 (values >= 179 invert)
        out[f"solarize_{t}"] = ImageOps.solarize(im, t)
    for name, enhancer in (("brightness", ImageEnhance.Brightness), ("color", ImageEnhance.Color),
                           ("contrast", ImageEnhance.Contrast), ("sharpness", ImageEnhance.Sharpness)):
        for f in (0.19, 0.6, 1.3, 1.81):
            out[f"{name}_{f}"] = enhancer(im).enhance(f)
    fill = (7, 8, 9)
    for rname, rs in (("nearest", Image.NEAREST), ("bilinear", Image.BILINEAR)):
        for deg in (27, -9, 90):
            out[f"rotate_{deg}_{rname}"] = im.rotate(deg, resample=rs, fillcolor=fill)
        for m in (0.27, -0.09):
            out[f"shear_x_{m}_{rname}"] = im.transform(im.size, Image.AFFINE, (1, m, 0, 0, 1, 0), resample=rs,
                                                       fillcolor=fill)
            out[f"shear_y_{m}_{rname}"] = im.transform(im.size, Image.AFFINE, (1, 0, 0, m, 1, 0), resample=rs,
                                                       fillcolor=fill)
        for dx, dy in ((3.4, 0), (0, -4.05), (-2, 1)):
            # Content moved by (dx, dy): the inverse map reads (x - dx, y - dy).
            out[f"translate_{dx}_{dy}_{rname}"] = im.transform(im.size, Image.AFFINE, (1, 0, -dx, 0, 1, -dy),
                                                               resample=rs, fillcolor=fill)
    tensors = {k: np.asarray(v, dtype=np.uint8) for k, v in out.items()}
    save_u8_safetensors(f"{out_dir}/rand_augment_pil.safetensors", tensors, {"pillow": PIL.__version__})
    print(f"wrote {len(tensors)} tensors with Pillow {PIL.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
