/* libFuzzer harness for the safetensors reader (core/ckpt/safetensors.c), which
 * parses checkpoint files that may be damaged. Checks the error contract
 * (negative errno, one line) and, for an accepted file, that every tensor
 * lies inside the data area and can be copied out. */
#include "../../core/ckpt/safetensors.h"
#include "fuzz.h"

#include <errno.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256] = "";
	struct safetensors st;
	unsigned char *buf = malloc(size ? size : 1);
	FUZZ_CHECK(buf);
	memcpy(buf, data, size);
	int rc = safetensors_parse(&st, buf, size, "fuzz.safetensors", err, sizeof err);
	if (rc < 0) {
		fuzz_check_err(rc, err);
		safetensors_free(&st);
		return 0;
	}
	for (int i = 0; i < st.nt; i++) {
		const struct st_tensor *t = &st.t[i];
		FUZZ_CHECK(st.data0 + t->begin + t->n * sizeof(float) <= st.len);
		if (t->n > 0 && t->n <= 4096) {
			float *x = malloc(t->n * sizeof(float));
			FUZZ_CHECK(x);
			safetensors_copy(&st, t, 0, t->n, x);
			free(x);
		}
	}
	safetensors_free(&st);
	return 0;
}
