/* libFuzzer harness for the safetensors reader (core/ckpt/safetensors.c), which
 * parses checkpoint files that may be damaged. Checks the error contract
 * (negative errno, one line) and, for an accepted file, that every tensor
 * lies inside the data area and can be copied out; and that reading the
 * header alone from a stream (safetensors_read_head, how a table's rows are
 * loaded) accepts and refuses exactly what the whole-file parse does. */
#include "../../core/ckpt/safetensors.h"
#include "fuzz.h"

#include <errno.h>
#include <stdio.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

/* The header read from a stream agrees with the whole file's parse: the
 * same verdict and, when accepted, the same tensors, and the stream left
 * at the data area. */
static void head_agrees(const uint8_t *data, size_t size, int rc, const struct safetensors *full)
{
	char err[256] = "";
	struct safetensors h;
	FILE *f = size ? fmemopen((void *)data, size, "rb") : NULL;
	if (!f)
		return;
	int hr = safetensors_read_head(&h, f, size, "fuzz.safetensors", err, sizeof err);
	if (hr < 0)
		fuzz_check_err(hr, err);
	FUZZ_CHECK((hr == 0) == (rc == 0));
	if (hr == 0) {
		FUZZ_CHECK(h.nt == full->nt && h.data0 == full->data0 && h.held == h.data0);
		FUZZ_CHECK((size_t)ftell(f) == h.data0);
		for (int i = 0; i < h.nt; i++)
			FUZZ_CHECK(h.t[i].begin == full->t[i].begin && h.t[i].n == full->t[i].n);
	}
	safetensors_free(&h);
	fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256] = "";
	struct safetensors st;
	unsigned char *buf = malloc(size ? size : 1);
	FUZZ_CHECK(buf);
	memcpy(buf, data, size);
	int rc = safetensors_parse(&st, buf, size, "fuzz.safetensors", err, sizeof err);
	head_agrees(data, size, rc, &st);
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
