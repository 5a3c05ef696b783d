/* Helpers shared by the tests that train or start processes. */
#include <criterion/criterion.h>

#include "util.h"

#include "../core/rng.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

/* K Gaussian blobs in D dimensions, well separated: a model that learns
 * anything gets far above chance, one that learns nothing stays at 1/K. */
void write_blobs(const char *path, int n, int K, int D, uint64_t seed)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "label");
	for (int j = 0; j < D; j++)
		fprintf(f, ",x%d", j);
	fprintf(f, "\n");
	for (int i = 0; i < n; i++) {
		int k = i % K;
		fprintf(f, "%d", k);
		for (int j = 0; j < D; j++) {
			double center = 2.5 * rng_normal(seed, 100 + (uint64_t)k, (uint64_t)j);
			double v = center + rng_normal(seed, RNG_DATA, (uint64_t)i * (uint64_t)D + (uint64_t)j);
			fprintf(f, ",%.5f", v);
		}
		fprintf(f, "\n");
	}
	cr_assert_eq(fclose(f), 0);
}

/* A free loopback port: bind port 0, read it back, close. The kernel may
 * hand the same port out again once it is closed, so a test (one process)
 * remembers what it got and never uses a port twice. */
int free_port(void)
{
	static int used[512];
	static int nused;
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		cr_assert_geq(fd, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
		socklen_t len = sizeof(a);
		cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
		close(fd);
		int port = ntohs(a.sin_port), seen = 0;
		for (int i = 0; i < nused; i++)
			seen |= used[i] == port;
		if (seen)
			continue;
		cr_assert_lt(nused, 512);
		used[nused++] = port;
		return port;
	}
}
