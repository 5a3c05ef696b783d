#!/usr/bin/python3
"""Seals cases with an AEGIS-256 written apart from pstrain's: libaegis
(Frank Denis), through its binding `aeg` from PyPI, which `make deps-test`
installs in build/pyvenv. tests/test_aegis.c writes the cases, runs this,
and compares net/aegis.c's bytes with these.

    build/pyvenv/bin/python tests/aegis_ref.py CASES OUT

CASES: records of key (32 bytes), nonce (32), ad length and message length
(little-endian uint32 each), the ad, the message. OUT: for each record, the
ciphertext then the 16-byte tag. The reference also opens what it sealed,
and must refuse it with the tag's last bit flipped, so that a binding that
did not check would not pass as a reference.
"""
import struct
import sys

from aeg import aegis256


def main():
    data = open(sys.argv[1], "rb").read()
    out = open(sys.argv[2], "wb")
    at = n = 0
    while at < len(data):
        key, nonce = data[at:at + 32], data[at + 32:at + 64]
        adlen, mlen = struct.unpack_from("<II", data, at + 64)
        at += 72
        ad, msg = data[at:at + adlen], data[at + adlen:at + adlen + mlen]
        at += adlen + mlen
        ct, tag = aegis256.encrypt_detached(key, nonce, msg, ad, maclen=16)
        if bytes(aegis256.decrypt_detached(key, nonce, ct, tag, ad)) != msg:
            print("aegis_ref: the reference did not open its own case %d" % n, file=sys.stderr)
            return 1
        bad = bytearray(tag)
        bad[15] ^= 1
        try:
            aegis256.decrypt_detached(key, nonce, ct, bad, ad)
            print("aegis_ref: the reference opened case %d with a changed tag" % n, file=sys.stderr)
            return 1
        except ValueError:
            pass
        out.write(ct)
        out.write(tag)
        n += 1
    out.close()
    print("aegis_ref: %d cases sealed with aeg's libaegis" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
