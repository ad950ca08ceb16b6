#!/usr/bin/env python3
"""Fixture for tests/cpu/test_golden_png.cpp: PNG decoding (data/image_codec.h) against Pillow's
Image.open(f).convert("RGB"), which torchvision's ImageFolder loader calls. Needs only numpy and Pillow:

    python3 tools/golden/pil_png.py tests/fixtures

The PNG files are written here byte by byte (struct and zlib, no PNG library), so every colour type, bit
depth, gAMA / sRGB / sBIT / tRNS chunk and Adam7 interlacing is exactly what the case names. It writes
png_pil.safetensors (about 16 kB): for each case NAME, "NAME.png" (the file's bytes, 1-D u8) and "NAME.rgb"
(Pillow's decoded image, HWC u8), with the Pillow version in the metadata; for 16-bit grey also
"NAME.high_byte", what hadatrain decodes instead (Note [PNG as PIL decodes it] in src/data/image_codec.cpp).
"""
import io
import struct
import sys
import warnings
import zlib

import numpy as np
import PIL
from PIL import Image

from pil_rand_augment import save_u8_safetensors

H, W = 5, 7  # odd sizes: rows of 1-, 2- and 4-bit samples end inside a byte
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel
# Adam7 passes: (x start, y start, x step, y step).
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def pack_row(samples, depth):
    """One scanline's samples (1-D ints) in PNG order: big-endian 16-bit, or packed MSB-first below 8 bits."""
    if depth == 16:
        return b"".join(struct.pack(">H", int(s)) for s in samples)
    if depth == 8:
        return bytes(int(s) for s in samples)
    per_byte = 8 // depth
    out = bytearray()
    for i in range(0, len(samples), per_byte):
        group = list(samples[i:i + per_byte]) + [0] * (per_byte - len(samples[i:i + per_byte]))
        byte = 0
        for s in group:
            byte = (byte << depth) | int(s)
        out.append(byte)
    return bytes(out)


def scanlines(a, depth, interlaced):
    """Filter type 0 scanlines of a (H, W, samples) array, whole or as the seven Adam7 sub-images."""
    passes = ADAM7 if interlaced else ((0, 0, 1, 1),)
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = a[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for row in sub:
            raw += b"\x00" + pack_row(row.reshape(-1), depth)
    return raw


def png(a, colour_type, depth, extra=(), plte=None, interlaced=False):
    ihdr = struct.pack(">IIBBBBB", W, H, depth, colour_type, 0, 0, 1 if interlaced else 0)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    for kind, data in extra:
        if kind != b"tRNS":
            out += chunk(kind, data)
    if plte is not None:
        out += chunk(b"PLTE", plte.astype(np.uint8).tobytes())
    for kind, data in extra:
        if kind == b"tRNS":  # after PLTE, before IDAT
            out += chunk(kind, data)
    out += chunk(b"IDAT", zlib.compress(scanlines(a, depth, interlaced), 9))
    return out + chunk(b"IEND", b"")


def gama(g):
    return (b"gAMA", struct.pack(">I", g))


def main(out_dir):
    rng = np.random.default_rng(0)

    def samples(colour_type, depth, top=None):
        top = (1 << depth) if top is None else top
        return rng.integers(0, top, size=(H, W, CHANNELS[colour_type]), dtype=np.int64)

    palette = rng.integers(0, 256, size=(256, 3), dtype=np.int64)
    cases = {}
    # 16 bits per sample: Pillow keeps the high byte (v >> 8); round(v / 257) differs for about half the values.
    cases["rgb16"] = png(samples(2, 16), 2, 16)
    cases["rgba16"] = png(samples(6, 16), 6, 16)
    cases["ga16"] = png(samples(4, 16), 4, 16)
    # 16-bit grey: Pillow opens it as 32-bit integers and clamps them to 255 in convert("RGB"); hadatrain keeps
    # the high byte as for the other 16-bit types, stored as "NAME.high_byte" beside Pillow's output.
    grey16 = {"gray16": samples(0, 16), "gray16_low": samples(0, 16, top=256)}  # _low: mostly 0..255
    grey16["gray16_low"][0, :3, 0] = (256, 4095, 65535)
    for name, a in grey16.items():
        cases[name] = png(a, 0, 16)
    cases["rgb16_gama1"] = png(samples(2, 16), 2, 16, [gama(100000)])
    cases["rgb16_sbit"] = png(samples(2, 16) & 0xFFF0, 2, 16, [(b"sBIT", bytes([12, 12, 12]))])
    rgb16_trns = samples(2, 16)
    cases["rgb16_trns"] = png(rgb16_trns, 2, 16, [(b"tRNS", struct.pack(">HHH", *rgb16_trns[1, 2]))])
    # A gAMA chunk other than sRGB's: Pillow does no gamma correction.
    cases["rgb8_gama1"] = png(samples(2, 8), 2, 8, [gama(100000)])
    cases["rgb8_gama08"] = png(samples(2, 8), 2, 8, [gama(80000)])
    cases["rgb8_srgb"] = png(samples(2, 8), 2, 8, [(b"sRGB", b"\x00"), gama(45455)])
    cases["rgba8_gama1"] = png(samples(6, 8), 6, 8, [gama(100000)])
    cases["gray8_gama1"] = png(samples(0, 8), 0, 8, [gama(100000)])
    cases["ga8_gama1"] = png(samples(4, 8), 4, 8, [gama(100000)])
    cases["pal8_gama1_trns"] = png(samples(3, 8, top=200), 3, 8,
                                   [gama(100000), (b"tRNS", rng.integers(0, 256, 150, dtype=np.int64).astype(np.uint8).tobytes())],
                                   plte=palette[:200])
    # Alpha is dropped without compositing; grey is replicated; low bit depths are scaled to 0..255.
    cases["rgb8"] = png(samples(2, 8), 2, 8)
    cases["rgba8"] = png(samples(6, 8), 6, 8)
    cases["ga8"] = png(samples(4, 8), 4, 8)
    cases["gray8"] = png(samples(0, 8), 0, 8)
    gray8_trns = samples(0, 8)
    cases["gray8_trns"] = png(gray8_trns, 0, 8, [(b"tRNS", struct.pack(">H", gray8_trns[0, 0, 0]))])
    rgb8_trns = samples(2, 8)
    cases["rgb8_trns"] = png(rgb8_trns, 2, 8, [(b"tRNS", struct.pack(">HHH", *rgb8_trns[0, 0]))])
    for depth in (1, 2, 4):
        cases[f"gray{depth}"] = png(samples(0, depth), 0, depth)
        cases[f"pal{depth}"] = png(samples(3, depth), 3, depth, plte=palette[:1 << depth])
    cases["pal8"] = png(samples(3, 8), 3, 8, plte=palette)
    cases["pal4_trns"] = png(samples(3, 4), 3, 4, [(b"tRNS", bytes([0, 128, 255, 7]))], plte=palette[:16])
    # Adam7 interlacing.
    cases["rgb8_adam7"] = png(samples(2, 8), 2, 8, interlaced=True)
    cases["ga16_adam7"] = png(samples(4, 16), 4, 16, interlaced=True)
    cases["pal2_adam7"] = png(samples(3, 2), 3, 2, plte=palette[:4], interlaced=True)

    # Pillow suggests converting palette images with tRNS to RGBA; torchvision converts to RGB, as here.
    warnings.filterwarnings("ignore", message="Palette images with Transparency")
    tensors = {}
    for name, data in cases.items():
        im = Image.open(io.BytesIO(data))
        rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
        assert rgb.shape == (H, W, 3), (name, rgb.shape)
        tensors[f"{name}.png"] = np.frombuffer(data, dtype=np.uint8)
        tensors[f"{name}.rgb"] = rgb
        print(f"{name}: Pillow mode {im.mode}")
    for name, a in grey16.items():
        tensors[f"{name}.high_byte"] = np.repeat(a >> 8, 3, axis=2).astype(np.uint8)
    save_u8_safetensors(f"{out_dir}/png_pil.safetensors", tensors, {"pillow": PIL.__version__})
    print(f"wrote {len(tensors)} tensors with Pillow {PIL.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
