/* Helpers shared by tests/test_train.c, test_cluster.c and test_robust.c. */
#ifndef PSTRAIN_TEST_UTIL_H
#define PSTRAIN_TEST_UTIL_H

#include <stdint.h>

/* CSV "label,x0,..": n rows of K well-separated Gaussian blobs in D
 * dimensions; asserts on any I/O failure. */
void write_blobs(const char *path, int n, int K, int D, uint64_t seed);

/* A loopback port nobody listens on, never the same twice in one test. */
int free_port(void);

#endif
