/* A float32's bit pattern and back, for the tests of the wire's float
 * encodings (tests/test_bf16.c, tests/test_fpack.c). */
#ifndef PSTRAIN_TEST_FLOATBITS_H
#define PSTRAIN_TEST_FLOATBITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static inline float flt(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

#endif
