#!/usr/bin/python3
"""Writes rope_scaling_golden.json: RoPE inverse frequencies as PyTorch computes them in
float32 for rope_scaling "linear" and "llama3", evaluated with torch's own Python
operators (so `2 * math.pi / t`, scalar promotion and the float32 roundings are
PyTorch's, as in transformers' modeling_rope_utils). model_transformer_test compares
ApplyRopeScaling(base) with inv_freq bit for bit (elementwise ops only, so the same on
every CPU), and ComputeRopeInvFreq with them to float32 precision (the base's pow may
differ by an ulp between vector widths).

Regenerate (needs Debian's python3-torch, not needed by the tests themselves):
  /usr/bin/python3 tests/model/testdata/make_rope_scaling_golden.py > tests/model/testdata/rope_scaling_golden.json
"""
import json
import math
import struct
import sys

import torch


def base_inv_freq(dim, theta):
    # theta ** (arange(0, dim, 2) / dim) in float32, inverted.
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3(inv, factor, low, high, original):
    low_wavelen = original / low
    high_wavelen = original / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def linear(inv, factor):
    inv = inv.clone()
    inv /= factor
    return inv


def bits(t):
    return ["0x%08x" % struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in t.tolist()]


CASES = [
    # name, head_dim, theta, rope_scaling
    ("llama-3.1-8b", 128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("llama-3.2-1b", 64, 500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("tiny", 8, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 128}),
    ("odd-factors", 96, 1000000.0, {"rope_type": "llama3", "factor": 3.0, "low_freq_factor": 1.5,
                                    "high_freq_factor": 5.25, "original_max_position_embeddings": 3000}),
    ("odd-factors-2", 80, 10000.0, {"rope_type": "llama3", "factor": 7.3, "low_freq_factor": 0.7,
                                    "high_freq_factor": 3.1, "original_max_position_embeddings": 777}),
    ("linear-2.5", 64, 10000.0, {"rope_type": "linear", "factor": 2.5}),
    ("linear-7", 128, 1000000.0, {"rope_type": "linear", "factor": 7.0}),
]


def main():
    out = {"torch_version": torch.__version__, "cases": []}
    for name, dim, theta, rs in CASES:
        inv = base_inv_freq(dim, theta)
        if rs["rope_type"] == "llama3":
            got = llama3(inv, rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                         rs["original_max_position_embeddings"])
        else:
            got = linear(inv, rs["factor"])
        assert got.dtype == torch.float32
        out["cases"].append({"name": name, "head_dim": dim, "rope_theta": theta, "rope_scaling": rs,
                             "base_inv_freq_bits": bits(inv), "inv_freq_bits": bits(got)})
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
