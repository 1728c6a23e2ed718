#!/usr/bin/python3
"""Independent reader of the echokv state formats, written from the tables in
docs/ARCHITECTURE.md ("Durable session state"), not from the C++ code.

  state_format_oracle.py STATE_DIR [SNAPSHOT_FILE ...]

Parses DIR/FORMAT, every DIR/sessions/<id>/manifest and the segments it lists, and each
snapshot stream; verifies every checksum (python3-xxhash), the field rules and the
canonical blob layout; prints one JSON document: {"sessions": {id: summary},
"snapshots": [summary]}, where a summary lists the segments and, per blob, its dtype,
shape and the XXH3-64 of its bytes. Exits 1 with a message on the first violation.
"""
import json
import os
import struct
import sys

import xxhash

DTYPES = {1: ("float32", 4), 2: ("float16", 2), 3: ("bfloat16", 2), 4: ("float64", 8),
          5: ("int8", 1), 6: ("uint8", 1), 7: ("int32", 4), 8: ("int64", 8), 9: ("bool", 1)}


class Bad(Exception):
    pass


def need(cond, what):
    if not cond:
        raise Bad(what)


def h64(b):
    return xxhash.xxh3_64_intdigest(b)


def align(n, a):
    return (n + a - 1) // a * a


def parse_manifest(b, where):
    need(len(b) >= 64, f"{where}: shorter than 64")
    need(b[0:8] == b"ECHOKVMF", f"{where}: magic")
    version, flags = struct.unpack_from("<II", b, 8)
    need(version == 1 and flags == 0, f"{where}: version/flags")
    fp_low, fp_high, json_len, ntok, reserved, hsum = struct.unpack_from("<QQQQQQ", b, 16)
    need(reserved == 0, f"{where}: reserved")
    need(hsum == h64(b[0:56]), f"{where}: header checksum")
    end = 64 + align(json_len, 4) + 4 * ntok + 8
    need(len(b) == end, f"{where}: size {len(b)} != {end}")
    need(struct.unpack_from("<Q", b, end - 8)[0] == h64(b[64:end - 8]), f"{where}: body checksum")
    need(b[64 + json_len:64 + align(json_len, 4)] == b"\0" * (align(json_len, 4) - json_len), f"{where}: pad")
    doc = json.loads(b[64:64 + json_len].decode("utf-8"))
    tokens = list(struct.unpack_from(f"<{ntok}i", b, 64 + align(json_len, 4)))
    for key in ("id", "tenant", "memory", "compression", "created_us", "last_used_us", "ttl_us",
                "next_position", "segments"):
        need(key in doc, f"{where}: no {key}")
    need(doc["memory"] in ("tiered", "evict"), f"{where}: memory")
    prev_end = None
    for i, s in enumerate(doc["segments"]):
        need(not s["supersedes"] or i == 0, f"{where}: supersedes not first")
        need(prev_end is None or s["token_begin"] == prev_end, f"{where}: gap")
        prev_end = s["token_end"]
    need(prev_end == ntok, f"{where}: segments end {prev_end} != {ntok} tokens")
    return doc, tokens, (fp_low, fp_high)


def parse_segment(b, entry, fp, where):
    need(len(b) >= 128, f"{where}: shorter than 128")
    need(b[0:8] == b"ECHOKVSG", f"{where}: magic")
    (version, flags, lo, hi, seq, tb, te, nblobs, tbytes, poff, plen, psum, tsum) = struct.unpack_from(
        "<IIQQQqqIIQQQQ", b, 8)
    need(version == 1, f"{where}: version")
    need(b[96:120] == b"\0" * 24, f"{where}: reserved")
    hsum = struct.unpack_from("<Q", b, 120)[0]
    need(hsum == h64(b[0:120]), f"{where}: header checksum")
    need((lo, hi) == fp, f"{where}: fingerprint differs from the manifest's")
    need(poff == align(128 + tbytes, 64), f"{where}: payload offset")
    need(len(b) == poff + plen, f"{where}: size")
    need(tsum == h64(b[128:128 + tbytes]), f"{where}: table checksum")
    need(b[128 + tbytes:poff] == b"\0" * (poff - 128 - tbytes), f"{where}: header pad")
    need(psum == h64(b[poff:poff + plen]), f"{where}: payload checksum")
    # The manifest entry says the same.
    need(entry["seq"] == seq and entry["token_begin"] == tb and entry["token_end"] == te, f"{where}: entry")
    need(entry["supersedes"] == bool(flags & 1) and flags & ~1 == 0, f"{where}: flags")
    need(entry["payload_bytes"] == plen and entry["file_bytes"] == len(b), f"{where}: lengths")
    need(entry["payload_xxh3"] == f"{psum:016x}" and entry["header_xxh3"] == f"{hsum:016x}", f"{where}: sums")
    blobs, pos, end = [], 128, 0
    for _ in range(nblobs):
        (nlen,) = struct.unpack_from("<H", b, pos)
        name = b[pos + 2:pos + 2 + nlen].decode("ascii")
        pos += 2 + nlen
        dtype, rank = b[pos], b[pos + 1]
        pos += 2
        dims = list(struct.unpack_from(f"<{rank}q", b, pos))
        pos += 8 * rank
        off, nbytes = struct.unpack_from("<QQ", b, pos)
        pos += 16
        name_ok, size = DTYPES[dtype]
        count = 1
        for d in dims:
            count *= d
        need(nbytes == count * size, f"{where}: {name} bytes")
        need(off == align(end, 64), f"{where}: {name} offset not canonical")
        need(b[poff + end:poff + off] == b"\0" * (off - end), f"{where}: blob pad")
        data = b[poff + off:poff + off + nbytes]
        blobs.append({"name": name, "dtype": name_ok, "shape": dims, "xxh3": f"{h64(data):016x}"})
        end = off + nbytes
    need(pos == 128 + tbytes, f"{where}: table length")
    need(end == plen, f"{where}: payload length")
    return {"seq": seq, "token_begin": tb, "token_end": te, "supersedes": bool(flags & 1), "blobs": blobs}


def summary(doc, tokens, segments):
    return {"id": doc["id"], "tokens": tokens, "memory": doc["memory"], "segments": segments}


def read_dir(root):
    fmt = json.loads(open(os.path.join(root, "FORMAT")).read())
    need(fmt == {"format": "echokv-state", "version": 1}, "FORMAT")
    out = {}
    sessions = os.path.join(root, "sessions")
    for name in sorted(os.listdir(sessions)):
        d = os.path.join(sessions, name)
        b = open(os.path.join(d, "manifest"), "rb").read()
        doc, tokens, fp = parse_manifest(b, f"{name}/manifest")
        need(doc["id"] == name, f"{name}: id")
        segs = []
        for e in doc["segments"]:
            sb = open(os.path.join(d, f"seg-{e['seq']}.ekv"), "rb").read()
            segs.append(parse_segment(sb, e, fp, f"{name}/seg-{e['seq']}.ekv"))
        out[name] = summary(doc, tokens, segs)
    return out


def read_snapshot(path):
    b = open(path, "rb").read()
    need(b[0:8] == b"ECHOKVSN", "snapshot magic")
    version, flags, lo, hi, mbytes, nseg, reserved, hsum = struct.unpack_from("<IIQQQQQQ", b, 8)
    need(version == 1 and flags == 0 and reserved == 0, "snapshot version/flags")
    need(hsum == h64(b[0:56]), "snapshot header checksum")
    doc, tokens, fp = parse_manifest(b[64:64 + mbytes], "snapshot manifest")
    need(fp == (lo, hi), "snapshot fingerprint")
    need(len(doc["segments"]) == nseg, "snapshot segment count")
    pos, segs = 64 + mbytes, []
    for e in doc["segments"]:
        segs.append(parse_segment(b[pos:pos + e["file_bytes"]], e, fp, f"snapshot seg {e['seq']}"))
        pos += e["file_bytes"]
    t = b[pos:]
    need(len(t) == 32 and t[0:8] == b"ECHOKVEN", "trailer")
    before, ssum, tsum = struct.unpack_from("<QQQ", t, 8)
    need(before == pos and ssum == h64(b[0:pos]) and tsum == h64(t[0:24]), "trailer fields")
    return summary(doc, tokens, segs)


def main():
    try:
        result = {"sessions": read_dir(sys.argv[1]), "snapshots": [read_snapshot(p) for p in sys.argv[2:]]}
    except (Bad, KeyError, ValueError, struct.error) as e:
        print(f"oracle: {e}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
