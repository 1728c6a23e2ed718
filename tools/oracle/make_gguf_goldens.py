#!/usr/bin/env python3
"""Writes the GGUF reader's and the dequantizers' golden files, from the PyPI `gguf` package
(the format's own Python reader, writer and dequantizers), into tests/model/testdata/gguf/:

  dequant/<TYPE>.bin      generated blocks of one ggml type and gguf.quants.dequantize's float32
                          output for them (layout in tests/model/testdata/gguf/README.md)
  dequant/manifest.json   per type: id, block shape, block count, which f16 scale cases it covers
  files/<name>.gguf       small GGUF files written by gguf.GGUFWriter (v3, alignment 64 / 256 / the
                          default 32; a v2 copy; a big-endian copy)
  files/<name>.json       what gguf.GGUFReader reports for each: header, every metadata key with its
                          type and value, the tensor table, each tensor's dequantized values

Run by hand in the oracle venv (tools/oracle/make_venv.sh); no test runs this script:

  .cache/oracle-venv/bin/python tools/oracle/make_gguf_goldens.py [--out tests/model/testdata/gguf]

The output is deterministic (fixed seed, no timestamps): running it twice gives the same bytes.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

SEED = 27
MAGIC = b"EKVGGDQ1"

# Types asked for by issue 27, then the extra K types gguf can dequantize. Q8_K is not here:
# gguf.quants.dequantize raises NotImplementedError for it (it is only ever an intermediate of
# llama.cpp's dot products, never a tensor type in a model file).
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
         "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K"]

# Byte offsets of the f16 scale fields inside one block: (d, dmin-or-m or None).
SCALE_FIELDS = {
    "Q4_0": (0, None), "Q4_1": (0, 2), "Q5_0": (0, None), "Q5_1": (0, 2), "Q8_0": (0, None),
    "Q2_K": (80, 82),   # scales[16] qs[64] d dmin
    "Q3_K": (108, None),  # hmask[32] qs[64] scales[12] d
    "Q4_K": (0, 2), "Q5_K": (0, 2),
    "Q6_K": (208, None),  # ql[128] qh[64] scales[16] d
}

# f16 bit patterns the scale fields cycle through: normal, zero, negative, subnormal, large.
# No inf or NaN: a model file never holds one in a scale, and the outputs would be NaN/inf
# wherever the quant is zero (0 * inf).
SCALE_CASES = [
    ("1.0", 0x3C00), ("+0", 0x0000), ("-0", 0x8000), ("-0.5", 0xB800),
    ("min subnormal 2^-24", 0x0001), ("max subnormal", 0x03FF), ("-subnormal", 0x8200),
    ("min normal 2^-14", 0x0400), ("max 65504", 0x7BFF), ("-65504", 0xFBFF),
    ("0.0999755859375", 0x2E66), ("-3.140625", 0xC248),
]

BLOCKS_SMALL = 64   # types with 32-element blocks
BLOCKS_K = 32       # types with 256-element blocks

# Special values for the float types (as bit patterns).
F32_SPECIAL = [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000,
               0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
               0x7F800001, 0xFFC00123, 0x3EAAAAAB]
F16_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xBC00,
               0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE01, 0x3555]
BF16_SPECIAL = [0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F,
                0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x3EAB]


def qtype(name):
    return T[name]


def random_finite_f16(rng):
    """A random f16 bit pattern that is neither inf nor NaN."""
    while True:
        bits = int(rng.integers(0, 1 << 16))
        if (bits >> 10) & 0x1F != 0x1F:
            return bits


def make_blocks(name, rng):
    """(raw uint8 bytes [n_blocks, block_bytes], list of (d_case, dmin_case) per block)."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype(name)]
    if name in ("F32", "F16", "BF16"):
        if name == "F32":
            special, width, count = F32_SPECIAL, 4, 256
        elif name == "F16":
            special, width, count = F16_SPECIAL, 2, 512
        else:
            special, width, count = BF16_SPECIAL, 2, 512
        rand = rng.integers(0, 1 << (8 * width), size=count, dtype=np.uint64)
        words = np.array(list(special) + [int(x) for x in rand],
                         dtype=np.uint32 if width == 4 else np.uint16)
        return words.astype("<u4" if width == 4 else "<u2").view(np.uint8).reshape(-1, block_bytes), None
    n_blocks = BLOCKS_K if block_elems == 256 else BLOCKS_SMALL
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d_off, m_off = SCALE_FIELDS[name]
    fields = [d_off] + ([m_off] if m_off is not None else [])
    cases = []
    n = len(SCALE_CASES)
    for i in range(n_blocks):
        if i in (0, 1):
            # Block 0: every quant byte 0x00; block 1: every quant byte 0xFF; scales 1.0.
            raw[i, :] = 0x00 if i == 0 else 0xFF
            chosen = [("1.0", 0x3C00)] * len(fields)
        else:
            chosen = []
            for f, _ in enumerate(fields):
                j = (i + 5 * f) if f == 0 else (3 * i + 7)
                if i < 2 * n + 2:
                    chosen.append(SCALE_CASES[j % n])
                else:
                    bits = random_finite_f16(rng)
                    chosen.append((f"random 0x{bits:04X}", bits))
        for off, (_, bits) in zip(fields, chosen):
            raw[i, off:off + 2] = np.frombuffer(struct.pack("<H", bits), dtype=np.uint8)
        cases.append([c[0] for c in chosen])
    return raw, cases


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def write_dequant(out_dir, rng):
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"generator": "tools/oracle/make_gguf_goldens.py", "seed": SEED,
                "gguf_version": gguf_version(), "magic": MAGIC.decode(), "types": []}
    for name in TYPES:
        qt = qtype(name)
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        raw, cases = make_blocks(name, rng)
        n_blocks = raw.shape[0]
        out = gguf.quants.dequantize(raw.reshape(-1).copy(), qt)
        out = np.asarray(out, dtype=np.float32).reshape(-1)
        assert out.size == n_blocks * block_elems, (name, out.size)
        header = MAGIC + struct.pack("<IIII", int(qt), block_elems, block_bytes, n_blocks)
        header += name.encode().ljust(16, b"\0")
        assert len(header) == 40
        body = raw.tobytes()
        pad = b"\0" * ((-len(body)) % 4)
        payload = header + body + pad + out.astype("<f4").tobytes()
        path = os.path.join(out_dir, f"{name}.bin")
        with open(path, "wb") as fh:
            fh.write(payload)
        n_nan = int(np.isnan(out).sum())
        n_inf = int(np.isinf(out).sum())
        entry = {"type": name, "ggml_type": int(qt), "block_elems": block_elems,
                 "block_bytes": block_bytes, "n_blocks": n_blocks, "file": f"{name}.bin",
                 "file_bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
                 "outputs_nan": n_nan, "outputs_inf": n_inf,
                 "outputs_subnormal": int(((out != 0) & (np.abs(out) < np.float32(2.0 ** -126))).sum()),
                 "outputs_negative_zero": int(((out == 0) & np.signbit(out)).sum())}
        if cases is not None:
            entry["scale_cases_per_block"] = cases
        manifest["types"].append(entry)
        print(f"dequant {name:5s} {n_blocks:4d} blocks  {len(payload):7d} B  nan={n_nan} inf={n_inf}")
    with open(os.path.join(out_dir, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")


# ---------------------------------------------------------------------------------------------
# Small GGUF files.


class Writer(gguf.GGUFWriter):
    """GGUFWriter that can also write an empty array (the stock writer raises "Empty array").

    The spec allows a zero-length array (type, then count 0); this writes exactly that, with the
    element type given as `sub_type`. Everything else is the stock writer's code path.
    """

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == V.ARRAY and len(val) == 0:
            if sub_type is None:
                raise ValueError("an empty array needs its element type")
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type)
            out += self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)


# (key, type, value[, element type]) in file order, after general.architecture.
def all_types_metadata():
    return [
        ("test.u8", V.UINT8, 255),
        ("test.i8", V.INT8, -128),
        ("test.u16", V.UINT16, 65535),
        ("test.i16", V.INT16, -32768),
        ("test.u32", V.UINT32, 4294967295),
        ("test.i32", V.INT32, -2147483648),
        ("test.u64", V.UINT64, 18446744073709551615),
        ("test.i64", V.INT64, -9223372036854775808),
        ("test.f32", V.FLOAT32, 0.1),             # stored as float32 0x3DCCCCCD
        ("test.f32_neg_subnormal", V.FLOAT32, -1.401298464324817e-45),
        ("test.f64", V.FLOAT64, -2.5e-300),
        ("test.bool_true", V.BOOL, True),
        ("test.bool_false", V.BOOL, False),
        ("test.string", V.STRING, "héllo, 世界 🙂\n\ttab \"quote\" \\"),
        ("test.string_empty", V.STRING, ""),
        ("test.arr.u8", V.ARRAY, [0, 1, 254, 255], V.UINT8),
        ("test.arr.i8", V.ARRAY, [-128, -1, 0, 127], V.INT8),
        ("test.arr.u16", V.ARRAY, [0, 65535], V.UINT16),
        ("test.arr.i16", V.ARRAY, [-32768, 32767], V.INT16),
        ("test.arr.u32", V.ARRAY, [0, 1, 4294967295], V.UINT32),
        ("test.arr.i32", V.ARRAY, [-2147483648, -1, 2147483647], V.INT32),
        ("test.arr.u64", V.ARRAY, [0, 18446744073709551615], V.UINT64),
        ("test.arr.i64", V.ARRAY, [-9223372036854775808, 9223372036854775807], V.INT64),
        ("test.arr.f32", V.ARRAY, [0.0, -0.0, 1.5, -3.25e-7, 3.4028234663852886e38], V.FLOAT32),
        ("test.arr.f64", V.ARRAY, [1e300, -0.0, 0.1], V.FLOAT64),
        ("test.arr.bool", V.ARRAY, [True, False, True], V.BOOL),
        ("test.arr.string", V.ARRAY, ["a", "", "ünïcödé", "<|im_start|>"], V.STRING),
        ("test.arr.nested_string", V.ARRAY, [["x", "yy"], ["zzz"], ["", "w"]], V.ARRAY),
        ("test.arr.nested_i32", V.ARRAY, [[1, 2, 3], [-4]], V.ARRAY),
        ("test.arr.empty_i32", V.ARRAY, [], V.INT32),
        ("test.arr.empty_string", V.ARRAY, [], V.STRING),
        ("test.arr.empty_f32", V.ARRAY, [], V.FLOAT32),
    ]


def known_floats(n, scale=1.0, offset=0.0):
    i = np.arange(n, dtype=np.float64)
    return (np.sin(i * 0.37 + 0.1) * scale + offset).astype(np.float32)


def quantized_tensor(name, np_shape, rng):
    """uint8 bytes shaped (..., row_bytes) for a quant type, from known floats where gguf can
    quantize the type, else generated blocks (K types: gguf-py has no quantizer for them)."""
    qt = qtype(name)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
    n = int(np.prod(np_shape))
    try:
        data = known_floats(n, scale=2.0).reshape(np_shape)
        q = gguf.quants.quantize(data, qt)
        return np.ascontiguousarray(q)
    except (NotImplementedError, gguf.quants.QuantError):
        pass
    # Random quant bytes with model-like scales: d and dmin uniform in [0.005, 0.05).
    n_blocks = n // block_elems
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d_off, m_off = SCALE_FIELDS[name]
    for off in (d_off, m_off):
        if off is not None:
            scales = rng.uniform(0.005, 0.05, size=n_blocks).astype(np.float16)
            raw[:, off:off + 2] = scales.astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(tuple(np_shape[:-1]) + (np_shape[-1] // block_elems * block_bytes,))


def float_tensor(name, np_shape):
    n = int(np.prod(np_shape))
    vals = known_floats(n, scale=3.0, offset=0.25).reshape(np_shape)
    if name == "F32":
        return vals, None
    if name == "F16":
        return vals.astype(np.float16), None
    if name == "BF16":
        return np.ascontiguousarray(gguf.quants.quantize(vals, T.BF16)), T.BF16
    raise ValueError(name)


FILE_SPECS = {
    # name: (alignment or None for the default, metadata, [(tensor name, type, numpy shape)])
    "all_types_v3_align64": (64, "all", [
        ("t.f32.1d", "F32", (7,)),
        ("t.f32.single", "F32", (1,)),
        ("t.f16.2d", "F16", (3, 5)),
        ("t.bf16.3d", "BF16", (2, 3, 4)),
        ("t.f32.4d", "F32", (1, 2, 1, 3)),
        ("t.q8_0.2d", "Q8_0", (3, 64)),
        ("t.q4_0.3d", "Q4_0", (2, 2, 32)),
        ("t.q4_1.2d", "Q4_1", (5, 32)),
        ("t.q5_0.1d", "Q5_0", (96,)),
        ("t.q5_1.2d", "Q5_1", (2, 64)),
    ]),
    "k_types_v3_align256": (256, "few", [
        ("blk.0.attn_q.weight", "Q4_K", (2, 2, 256)),
        ("blk.0.attn_k.weight", "Q5_K", (1, 256)),
        ("blk.0.ffn_down.weight", "Q6_K", (3, 256)),
        ("blk.0.ffn_up.weight", "Q2_K", (2, 256)),
        ("blk.0.ffn_gate.weight", "Q3_K", (512,)),
        ("blk.0.attn_norm.weight", "F32", (13,)),
    ]),
    "default_align_v3": (None, "few", [
        ("a", "F32", (3,)),
        ("b", "F16", (5,)),
        ("c", "Q8_0", (32,)),
    ]),
}


def metadata_for(kind):
    if kind == "all":
        return all_types_metadata()
    return [
        ("general.name", V.STRING, "echokv test file"),
        ("test.count", V.UINT32, 3),
        ("test.names", V.ARRAY, ["one", "two", "three"], V.STRING),
    ]


def write_gguf(path, alignment, metadata, tensors, rng, endian=gguf.GGUFEndian.LITTLE):
    w = Writer(path, arch="echokv-test", endianess=endian)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for item in metadata:
        key, vt, val = item[0], item[1], item[2]
        sub = item[3] if len(item) > 3 else None
        w.add_key_value(key, val, vt, sub_type=sub)
    arrays = {}
    for tname, ttype, shape in tensors:
        if ttype in ("F32", "F16", "BF16"):
            arr, raw_dtype = float_tensor(ttype, shape)
        else:
            arr, raw_dtype = quantized_tensor(ttype, shape, rng), qtype(ttype)
        arrays[tname] = (arr, raw_dtype)
        w.add_tensor(tname, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def flatten(v):
    if isinstance(v, list):
        out = []
        for x in v:
            out.extend(flatten(x))
        return out
    return [v]


def json_float(x, vt):
    """A float as JSON: the exact double (repr round-trips), plus its bits."""
    x = float(x)
    if vt == V.FLOAT32:
        bits = f"0x{f32_bits(x):08X}"
        x = struct.unpack("<f", struct.pack("<f", x))[0]
    else:
        bits = "0x%016X" % struct.unpack("<Q", struct.pack("<d", x))[0]
    if math.isnan(x) or math.isinf(x):
        return {"value": None, "bits": bits}
    return {"value": x, "bits": bits}


def describe(path, written_meta, tensor_specs, alignment, version_note=None):
    """What gguf.GGUFReader reports for the file, cross-checked with what was written."""
    r = gguf.GGUFReader(path)
    fields = list(r.fields.values())
    header = {f.name: int(f.contents()) for f in fields if f.name.startswith("GGUF.")}
    meta = [f for f in fields if not f.name.startswith("GGUF.")]
    written = {"general.architecture": (V.STRING, "echokv-test", None)}
    if alignment is not None:
        written["general.alignment"] = (V.UINT32, alignment, None)
    for item in written_meta:
        written[item[0]] = (item[1], item[2], item[3] if len(item) > 3 else None)
    assert [f.name for f in meta] == list(written), "key order differs from what was written"
    out_meta = []
    for f in meta:
        vt, val, sub = written[f.name]
        types = [t.name for t in f.types]
        entry = {"key": f.name, "type": f.types[0].name, "type_id": int(f.types[0])}
        reported = f.contents() if f.types else None
        if vt == V.ARRAY:
            entry["element_type"] = (sub.name if sub is not None else types[1])
            if sub == V.ARRAY:
                inner = types[2] if len(types) > 2 else None
                entry["inner_element_type"] = inner
                entry["value"] = val
                entry["count"] = len(val)
                entry["gguf_reader_types"] = types
                entry["gguf_reader_flattened"] = reported
                assert reported == flatten(val), (f.name, reported)
            elif len(val) == 0:
                entry["value"] = []
                entry["count"] = 0
                entry["gguf_reader_types"] = types
            else:
                entry["count"] = len(val)
                if sub in (V.FLOAT32, V.FLOAT64):
                    entry["value"] = [json_float(x, sub)["value"] for x in reported]
                    entry["bits"] = [json_float(x, sub)["bits"] for x in reported]
                else:
                    entry["value"] = reported
                    assert reported == val, (f.name, reported, val)
        elif vt in (V.FLOAT32, V.FLOAT64):
            entry.update(json_float(reported, vt))
        else:
            entry["value"] = reported
            assert reported == val, (f.name, reported, val)
        out_meta.append(entry)
    spec_by_name = {t[0]: t for t in tensor_specs}
    out_tensors = []
    for t in r.tensors:
        _, ttype, np_shape = spec_by_name[t.name]
        assert t.tensor_type.name == ttype
        ne = [int(x) for x in t.shape]
        assert tuple(reversed(ne)) == tuple(np_shape), (t.name, ne, np_shape)
        if r.byte_order == "S":
            # gguf.quants.dequantize views the bytes in host order, which misreads a byte-swapped
            # file; the reader's own arrays carry the file's byte order (F32/F16 only, see below).
            assert t.tensor_type in (T.F32, T.F16), t.name
            vals = np.asarray(t.data).astype(np.float32).reshape(-1)
        else:
            vals = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            vals = np.asarray(vals, dtype=np.float32).reshape(-1)
        assert vals.size == t.n_elements
        le = vals.astype("<f4").tobytes()
        out_tensors.append({
            "name": t.name, "type": t.tensor_type.name, "type_id": int(t.tensor_type),
            "n_dims": len(ne), "ne": ne, "numpy_shape": list(np_shape),
            "n_elements": int(t.n_elements), "n_bytes": int(t.n_bytes),
            "offset": int(t.data_offset - r.data_offset),
            "file_offset": int(t.data_offset),
            "f32_sha256": hashlib.sha256(le).hexdigest(),
            "f32_sum": float(np.sum(vals.astype(np.float64))),
            "f32_values": [float(x) for x in vals] if vals.size <= 1536 else None,
        })
    desc = {
        "generator": "tools/oracle/make_gguf_goldens.py", "gguf_version": gguf_version(),
        "file": os.path.basename(path), "file_bytes": os.path.getsize(path),
        "file_sha256": sha256_file(path),
        "version": header["GGUF.version"], "tensor_count": header["GGUF.tensor_count"],
        "kv_count": header["GGUF.kv_count"],
        "byte_order": "big" if r.endianess == gguf.GGUFEndian.BIG else "little",
        "alignment": int(r.alignment), "alignment_key_present": alignment is not None,
        "data_offset": int(r.data_offset),
        "metadata": out_meta, "tensors": out_tensors,
    }
    if version_note:
        desc["note"] = version_note
    return desc


def sha256_file(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def gguf_version():
    import importlib.metadata as md
    return md.version("gguf")


def write_files(out_dir, rng):
    os.makedirs(out_dir, exist_ok=True)
    for name, (alignment, kind, tensors) in FILE_SPECS.items():
        path = os.path.join(out_dir, name + ".gguf")
        meta = metadata_for(kind)
        write_gguf(path, alignment, meta, tensors, rng)
        desc = describe(path, meta, tensors, alignment)
        dump(os.path.join(out_dir, name + ".json"), desc)
        print(f"gguf {name}: {desc['file_bytes']} B, {desc['kv_count']} keys, {desc['tensor_count']} tensors")

    # Version 2: GGUFWriter only writes version 3. A little-endian v2 file has the same layout as
    # v3 (v3 only added big-endian files; v2 is where counts and lengths became uint64), so the
    # v2 file is the v3 one with the version field (bytes 4..7) set to 2. GGUFReader reads it.
    src = os.path.join(out_dir, "all_types_v3_align64.gguf")
    dst = os.path.join(out_dir, "all_types_v2_align64.gguf")
    with open(src, "rb") as fh:
        data = bytearray(fh.read())
    assert struct.unpack_from("<I", data, 4)[0] == 3
    struct.pack_into("<I", data, 4, 2)
    with open(dst, "wb") as fh:
        fh.write(data)
    alignment, kind, tensors = FILE_SPECS["all_types_v3_align64"]
    desc = describe(dst, metadata_for(kind), tensors, alignment,
                    "all_types_v3_align64.gguf with the version field set to 2 (the layouts are the same)")
    assert desc["version"] == 2
    dump(os.path.join(out_dir, "all_types_v2_align64.json"), desc)
    print(f"gguf all_types_v2_align64: {desc['file_bytes']} B")

    # Big-endian: GGUFWriter(endianess=BIG) byte-swaps every number, the metadata and the tensor
    # data. Nothing in the file says so: a little-endian reader sees version 0x03000000.
    # Only F32/F16 tensors: GGUFWriter byte-swaps numpy arrays, and a quantized tensor is a uint8
    # array, so its f16 scales would stay little-endian inside a big-endian file.
    path = os.path.join(out_dir, "big_endian_v3.gguf")
    alignment, kind = None, "few"
    tensors = [("a", "F32", (3,)), ("b", "F16", (5,))]
    meta = metadata_for(kind)
    write_gguf(path, alignment, meta, tensors, rng, endian=gguf.GGUFEndian.BIG)
    desc = describe(path, meta, tensors, alignment,
                    "big-endian file (GGUFEndian.BIG): default_align_v3's metadata and its F32/F16 "
                    "tensors; the version field reads 0x03000000 little-endian, which is how "
                    "GGUFReader detects the swap. Nothing else in the file says it is big-endian.")
    assert desc["byte_order"] == "big"
    dump(os.path.join(out_dir, "big_endian_v3.json"), desc)
    print(f"gguf big_endian_v3: {desc['file_bytes']} B")


def dump(path, obj):
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1, ensure_ascii=False)
        fh.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--out", default=os.path.join(root, "tests", "model", "testdata", "gguf"))
    args = ap.parse_args()
    rng = np.random.default_rng(SEED)
    for sub in ("dequant", "files"):
        shutil.rmtree(os.path.join(args.out, sub), ignore_errors=True)
    write_dequant(os.path.join(args.out, "dequant"), rng)
    write_files(os.path.join(args.out, "files"), rng)
    total = 0
    for dirpath, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    print(f"total {total} bytes under {args.out}")


if __name__ == "__main__":
    sys.exit(main())
