/* bfloat16 on the wire: float32 narrowed to its upper 16 bits with
 * round-to-nearest-even, and widened back exactly. `[cluster] wire_dtype`
 * sends gradients and/or parameters this way (docs/CONFIG.md); net/msg.c
 * calls these while it encodes a chunk straight into the frame buffer being
 * sealed and decodes one straight into the destination tensor, so a bf16
 * tensor is never copied whole.
 *
 * A bf16 value is the upper half of a float32's bits: sign, the same 8
 * exponent bits, 7 of the 23 mantissa bits. Widening appends 16 zero bits
 * and is exact. Narrowing:
 *   - finite values round to nearest, ties to the even bf16 (the rule of
 *     IEEE-754's default rounding); subnormals likewise (the integer
 *     rounding below is the same on them, no flush to zero);
 *   - except that a finite float32 beyond the largest finite bf16
 *     (±3.3895314e38, 0x7f7f) becomes that largest finite value, not ±inf
 *     as IEEE would give for the 0.2% of the top binade that rounds up: a
 *     ps refuses a gradient that is not finite, and a worker checks that
 *     its gradient is finite before it pushes, so a finite gradient must
 *     stay finite on the wire, or an honest worker would be refused for
 *     what it could not see (tests/test_bf16.c);
 *   - ±inf stays ±inf;
 *   - NaN stays NaN, quiet (bit 6 set), with its sign and the upper 6 bits
 *     of its payload: a NaN whose payload lies only in the dropped bits
 *     would otherwise become an infinity.
 *
 * The bulk functions are plain loops of integer operations that gcc -O3
 * vectorizes (SSE2 / AVX2); bytes on the wire are little-endian like every
 * other field (docs/PROTOCOL.md). */
#ifndef PSTRAIN_NET_BF16_H
#define PSTRAIN_NET_BF16_H

#include <stddef.h>
#include <stdint.h>

/* The bf16 bits nearest float32 bits u (the rules above). */
static inline uint16_t bf16_round(uint32_t u)
{
	uint32_t a = u & 0x7fffffffu;
	uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* RNE; may carry to inf */
	uint32_t nan = (u >> 16) | 0x40u;
	r = a > 0x7f800000u ? nan : r;
	/* A finite value that rounded up into the infinity: the largest finite. */
	r = (a < 0x7f800000u && (r & 0x7fffu) == 0x7f80u) ? r - 1u : r;
	return (uint16_t)r;
}

/* float32 bits of bf16 bits h: exact. */
static inline uint32_t bf16_widen(uint16_t h)
{
	return (uint32_t)h << 16;
}

/* N floats to 2*N bytes of little-endian bf16 at dst (any alignment).
 * src and dst must not overlap. */
void bf16_from_f32(uint8_t *dst /* (2N) */, const float *src /* (N) */, size_t N);

/* 2*N bytes of little-endian bf16 at src (any alignment) to N floats. */
void bf16_to_f32(float *dst /* (N) */, const uint8_t *src /* (2N) */, size_t N);

#endif
