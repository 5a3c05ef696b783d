/* float32 packed without loss: the same bits in about 7/8 of the bytes.
 *
 * Where a link is what limits a step (1 Gbit/s: bench/netlab), fewer
 * bytes on the wire is the only thing left to win, and bf16 gives up
 * precision for it. A float32's 8 exponent bits carry little
 * information in a tensor of weights or gradients: they cluster within a
 * few binades of the largest (the MLP's weights: 2.5 bits of entropy,
 * its momentum 4.0), while the sign and 23 mantissa bits are close to
 * random. So the exponent travels as a 4-bit distance below the
 * tensor's largest, and the other 24 bits as they are:
 *
 *   byte 0             emax: the largest exponent field of the values
 *   ceil(N/2) bytes    a 4-bit code per value, value 2i in the low nibble
 *                      of byte i, 2i+1 in the high one (0 after the last
 *                      value); code c < 15 means exponent emax - c, code
 *                      15 an escape
 *   2 N bytes          each value's low 16 bits, little-endian
 *   N bytes            each value's mantissa bits 16-22 in bits 0-6, its
 *                      sign in bit 7
 *   one byte per escape, in value order: that value's exponent field
 *
 * Planes of whole bytes rather than 3-byte groups, so that the loops over
 * them are plain vector code (gcc -O3).
 *
 * N values take 1 + ceil(N/2) + 3N + escapes bytes: 3.5 bytes a value
 * (12.5% fewer than float32) when nothing escapes. Escapes are the values
 * more than 14 binades below the largest, zeros among them; a sender
 * whose packing would not be smaller than float32 sends float32
 * (fpack_encode says so). Every float32 comes back bit for bit: NaNs with
 * their payloads, infinities, subnormals, -0.
 *
 * A packed body comes from a peer: fpack_check refuses any that
 * fpack_decode could not turn into exactly N values (a length that does
 * not match its escapes, a code naming an exponent below 0), so decoding
 * a checked body cannot fail or read past it. It also refuses every body
 * fpack_encode would not have written (an emax no value has, an escape
 * that a code could have said, a nonzero unused nibble, a body not
 * shorter than float32): the values have one packing, and a decoded body
 * packs back to the same bytes (tests/fuzz/fuzz_msg.c checks that). */
#ifndef PSTRAIN_NET_FPACK_H
#define PSTRAIN_NET_FPACK_H

#include <stddef.h>
#include <stdint.h>

/* Fewest bytes N packed values take (no escapes). */
static inline size_t fpack_min_bytes(size_t N)
{
	return 1 + (N + 1) / 2 + 3 * N;
}

/* Packs N > 0 floats into dst, at most cap bytes. Returns the bytes
 * written, or 0 if the packing would take more than cap (the caller then
 * sends the values as float32; cap = 4N - 1 asks for a gain). */
size_t fpack_encode(uint8_t *dst, size_t cap, const float *src /* (N) */, size_t N);

/* 0 if len bytes at src are fpack_encode's packing of N > 0 values with
 * cap 4N - 1, else -1. */
int fpack_check(const uint8_t *src, size_t len, size_t N);

/* Unpacks N values from a body fpack_check accepted. */
void fpack_decode(float *dst /* (N) */, const uint8_t *src, size_t N);

#endif
