/* See gradfold.h. */
#include "gradfold.h"

void grad_fold_add(float *restrict acc, const float *restrict g, size_t n)
{
	for (size_t i = 0; i < n; i++)
		acc[i] += g[i];
}

void grad_fold_finish(float *acc, int S, size_t n)
{
	float d = (float)S;
	for (size_t i = 0; i < n; i++)
		acc[i] /= d;
}
