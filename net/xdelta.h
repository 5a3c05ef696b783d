/* float32 parameters sent as what changed since the version the receiver
 * holds: the same bits, about 0.6 of float32's bytes, without loss.
 *
 * A sync step moves each weight by a small fraction of itself, so a value
 * and its previous version share their sign, exponent and top mantissa
 * bits: their XOR is a small integer (the MLP at lr 0.05: 14 significant
 * bits on average, 94% of the values in 2 or 3 bytes). A ps that kept its
 * pieces' previous version sends, to a worker that holds exactly that
 * version, each value's XOR with it in as few whole bytes as it takes:
 *
 *   4 bytes            the check: sum over the chunk's new values of
 *                      bits(v_i) * (2i + 1), mod 2^32, little-endian
 *   ceil(N/4) bytes    a 2-bit code per value, value 4i + k in bits
 *                      2k..2k+1 of byte i (0 after the last value):
 *                      code c means c + 1 bytes
 *   the values' bytes  each XOR's c + 1 low bytes, little-endian, in
 *                      value order; the last of them is not 0 (but for
 *                      a one-byte XOR of 0: each XOR has one writing)
 *
 * The receiver XORs each into the value it holds and compares the check
 * with the values it made: a worker whose parameters are not the version
 * the ps took them for (a bug: nothing on the wire can cause it, frames
 * are authenticated) gets a refusal, never silently wrong parameters.
 *
 * Against net/fpack.h's 3.5 bytes a value this is what makes the pull
 * smaller where a link limits the step; the gradient, which shares
 * nothing with the last one, stays packed by fpack. */
#ifndef PSTRAIN_NET_XDELTA_H
#define PSTRAIN_NET_XDELTA_H

#include <stddef.h>
#include <stdint.h>

/* Fewest bytes N values take (every XOR in one byte). */
static inline size_t xdelta_min_bytes(size_t N)
{
	return 4 + (N + 3) / 4 + N;
}

/* Writes src's N > 0 values as their XORs with base's (both N floats)
 * into dst, at most cap bytes. Returns the bytes written, or 0 if they
 * would take more than cap (cap = 4N - 1 asks for a gain over float32). */
size_t xdelta_encode(uint8_t *dst, size_t cap, const float *src, const float *base, size_t N);

/* 0 if len bytes at src can be xdelta_encode's output for N > 0 values
 * with cap 4N - 1 (codes and length agree, each XOR in its fewest
 * bytes), else -1. What is checked cannot make xdelta_apply read past
 * len bytes. */
int xdelta_check(const uint8_t *src, size_t len, size_t N);

/* XORs a checked body's N values into dst, which holds the version they
 * were made against; returns 0, or -1 if the result fails the check (dst
 * then holds neither version: the caller must not use it). */
int xdelta_apply(float *dst, const uint8_t *src, size_t N);

/* The check of N values (the body's first 4 bytes). */
uint32_t xdelta_sum(const float *v, size_t N);

#endif
