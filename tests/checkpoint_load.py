#!/usr/bin/env python3
"""Loads a pstrain checkpoint with the Python standard library alone and
checks it against `pstrain check --checkpoint`.

    checkpoint_load.py PSTRAIN_BIN DIR

DIR is a step-NNNNNNNN directory or a checkpoint_dir (its newest step
directory with a manifest is used). The script verifies the manifest's own
checksum and every shard file's size and BLAKE2b-256, parses each
safetensors header, reassembles every tensor from its parts across the
shard files (a part is a flat 1-D tensor with __metadata__
"pstrain.part.NAME" = "LO:HI/D0xD1..."; a part of an embedding table, in
the rows files, is its rows (HI-LO)/D1 x D1 with the same metadata),
checks that every element is
covered exactly once, and compares names, shapes, element counts and the
BLAKE2b-256 of each tensor's float32 little-endian bytes with what pstrain
prints. One line per tensor, "ok NAME SHAPE first=VALUE", on success;
exit status 1 with the reason on any mismatch.

This is also the reference for reading pstrain checkpoints from other
tools: numpy users can pass the reassembled bytes to numpy.frombuffer.
"""
import hashlib
import json
import os
import struct
import subprocess
import sys


def fail(msg):
    print("checkpoint_load.py: " + msg, file=sys.stderr)
    sys.exit(1)


def blake(data):
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def resolve(path):
    if any(f == "manifest" or f.startswith("manifest-0-of-") for f in os.listdir(path)):
        return path
    steps = sorted((d for d in os.listdir(path)
                    if d.startswith("step-") and len(d) == 13 and d[5:].isdigit()), reverse=True)
    for d in steps:
        names = os.listdir(os.path.join(path, d))
        n = [int(f.split("-of-")[1]) for f in names if f.startswith("manifest-0-of-")]
        # The newest complete one, as pstrain picks it: a cluster step
        # counts once every ps has written its manifest.
        if "manifest" in names or (n and all("manifest-%d-of-%d" % (k, n[0]) in names for k in range(n[0]))):
            return os.path.join(path, d)
    fail("%s: no checkpoint" % path)


def read_manifest(stepdir):
    """The "manifest" of a local checkpoint, or the merged
    "manifest-K-of-N" files a cluster's ps tasks write one each."""
    if os.path.exists(os.path.join(stepdir, "manifest")):
        return read_manifest_file(os.path.join(stepdir, "manifest"))
    n = [int(f.split("-of-")[1]) for f in os.listdir(stepdir) if f.startswith("manifest-0-of-")]
    if not n:
        fail("%s: no manifest" % stepdir)
    merged = None
    for k in range(n[0]):
        m = read_manifest_file(os.path.join(stepdir, "manifest-%d-of-%d" % (k, n[0])))
        if merged is None:
            merged = m
        else:
            for key in ("step", "params", "model", "layout", "shards", "tables"):
                if m[key] != merged[key]:
                    fail("manifest-%d-of-%d disagrees on %s" % (k, n[0], key))
            merged["files"] += m["files"]
            merged["rows"] += m["rows"]
    return merged


def read_manifest_file(path):
    if not os.path.exists(path):
        fail("%s: missing (incomplete checkpoint)" % path)
    raw = open(path, "rb").read()
    if not raw.endswith(b"\n"):
        fail("%s: truncated" % path)
    body, _, last = raw[:-1].rpartition(b"\n")
    body += b"\n"
    if not last.startswith(b"end ") or blake(body) != last[4:].decode():
        fail("%s: checksum mismatch" % path)
    lines = body.decode().splitlines()
    if lines[0] != "pstrain checkpoint 1":
        fail("manifest: not a pstrain checkpoint")
    m = {"files": [], "rows": [], "tables": None}
    for line in lines[1:]:
        w = line.split()
        if w[0] in ("shard", "rows"):
            # shard K BEGIN END BYTES FILE HASH: parameters [BEGIN, END);
            # rows K ...: rows [BEGIN, END) of the embedding tables
            m["files" if w[0] == "shard" else "rows"].append(
                {"begin": int(w[2]), "end": int(w[3]), "bytes": int(w[4]), "file": w[5], "sum": w[6]})
        elif w[0] == "tables":
            m["tables"] = w[1:]
        else:
            m[w[0]] = w[1]
    return m


def read_safetensors(path, size, digest):
    data = open(path, "rb").read()
    if len(data) != size:
        fail("%s: %d bytes, manifest says %d" % (path, len(data), size))
    if blake(data) != digest:
        fail("%s: checksum mismatch" % path)
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen].decode())
    meta = header.pop("__metadata__", {})
    base = 8 + hlen
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            fail("%s: %s is %s" % (path, name, t["dtype"]))
        b, e = t["data_offsets"]
        tensors[name] = (t["shape"], data[base + b:base + e])
    return meta, tensors


def main():
    if len(sys.argv) != 3:
        fail("usage: checkpoint_load.py PSTRAIN_BIN DIR")
    binary, stepdir = sys.argv[1], resolve(sys.argv[2])
    man = read_manifest(stepdir)
    full = {}   # name -> [shape, bytearray, covered elements]
    files = [("pstrain.range", s) for s in man["files"]] + [("pstrain.rows", s) for s in man["rows"]]
    for key, s in files:
        path = os.path.join(stepdir, s["file"])
        meta, tensors = read_safetensors(path, s["bytes"], s["sum"])
        if meta.get(key) != "%d:%d" % (s["begin"], s["end"]):
            fail("%s: %s %r does not match the manifest" % (path, key, meta.get(key)))
        for name, (shape, raw) in tensors.items():
            part = meta.get("pstrain.part." + name)
            n = len(raw) // 4
            if part:
                rng, _, dims = part.partition("/")
                lo, hi = (int(x) for x in rng.split(":"))
                shape = [int(x) for x in dims.split("x")]
                if hi - lo != n:
                    fail("%s: part %s of %s has %d elements" % (path, part, name, n))
            else:
                lo = 0
            total = 1
            for d in shape:
                total *= d
            entry = full.setdefault(name, [shape, bytearray(4 * total), 0])
            if entry[0] != shape:
                fail("%s: %s has shape %s here and %s elsewhere" % (path, name, shape, entry[0]))
            entry[1][4 * lo:4 * lo + len(raw)] = raw
            entry[2] += n

    out = subprocess.run([binary, "check", "--checkpoint", stepdir], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True)
    if out.returncode != 0:
        fail("pstrain check failed (%d): %s" % (out.returncode, out.stdout.strip()))
    reported = {}
    for line in out.stdout.splitlines():
        w = line.split()
        if w and w[0] == "tensor":
            reported[w[1]] = (w[2], int(w[3]), w[4].partition(":")[2])
    if sorted(reported) != sorted(full):
        fail("tensor names differ: pstrain %s, files %s" % (sorted(reported), sorted(full)))
    for name in sorted(full):
        shape, raw, covered = full[name]
        if covered != len(raw) // 4:
            fail("%s: %d of %d elements present across the shard files" % (name, covered, len(raw) // 4))
        shape_text = "x".join(str(d) for d in shape) if shape else "scalar"
        want = reported[name]
        got = (shape_text, len(raw) // 4, blake(bytes(raw)))
        if want != got:
            fail("%s: pstrain says %s, the files give %s" % (name, want, got))
        first = struct.unpack("<f", raw[:4])[0] if raw else float("nan")
        print("ok %s %s first=%.9g" % (name, shape_text, first))


if __name__ == "__main__":
    main()
