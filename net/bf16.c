/* See bf16.h. The loops load and store through memcpy (any alignment: the
 * payload of a chunk starts 36 bytes into a frame buffer) and on a
 * little-endian host store the 16-bit halves in host order, which is the
 * wire order; gcc -O3 turns both into vector code (-fopt-info-vec says
 * so, for every clone). Elsewhere, byte by byte. */
#include "bf16.h"

#include <string.h>

/* AVX2 and AVX-512 copies picked at load time, as in core/nn/optim.c: the
 * binary stays portable to any x86-64 and uses the wide units. */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define BF16_HOST_LE 1
#else
#define BF16_HOST_LE 0
#endif

VECTOR_CLONES void bf16_from_f32(uint8_t *dst, const float *src, size_t N)
{
	for (size_t i = 0; i < N; i++) {
		uint32_t u;
		memcpy(&u, src + i, sizeof u);
		uint16_t h = bf16_round(u);
		if (BF16_HOST_LE) {
			memcpy(dst + 2 * i, &h, sizeof h);
		} else {
			dst[2 * i] = (uint8_t)h;
			dst[2 * i + 1] = (uint8_t)(h >> 8);
		}
	}
}

VECTOR_CLONES void bf16_to_f32(float *dst, const uint8_t *src, size_t N)
{
	for (size_t i = 0; i < N; i++) {
		uint16_t h;
		if (BF16_HOST_LE)
			memcpy(&h, src + 2 * i, sizeof h);
		else
			h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
		uint32_t u = bf16_widen(h);
		memcpy(dst + i, &u, sizeof u);
	}
}
