/* libFuzzer harness for layer_spec_parse: the input is the text after
 * "layer =". A success must format back to text that parses to the same
 * spec; a failure is one line of text. */
#include "../../core/nn/model.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct layer_spec s, back;
	char err[1024], buf[64];
	char *text = malloc(size + 1);
	int ret;

	FUZZ_CHECK(text);
	memcpy(text, data, size);
	text[size] = '\0';
	err[0] = '\0';
	ret = layer_spec_parse(&s, text, err, sizeof(err));
	free(text);
	if (ret) {
		/* The message quotes the input; config lines never hold a
		 * newline, so only one that we add would count. */
		if (memchr(data, '\n', size))
			FUZZ_CHECK(ret < 0 && err[0]);
		else
			fuzz_check_err(ret, err);
		return 0;
	}
	FUZZ_CHECK(s.kind >= LAYER_DENSE && s.kind <= LAYER_EMBEDDING);
	FUZZ_CHECK(s.kind == LAYER_EMBEDDING ? s.embed.fields >= 1 && s.embed.fields <= EMBED_MAX_FIELDS &&
						       s.embed.rows >= 1 && s.embed.dim >= 1 &&
						       s.embed.dim <= EMBED_MAX_DIM
					     : s.embed.fields == 0);
	FUZZ_CHECK((s.kind == LAYER_DENSE || s.kind == LAYER_CONV) ? s.units >= 1 : s.units == 0);
	FUZZ_CHECK(s.kind == LAYER_DROPOUT ? s.p >= 0.0f && s.p < 1.0f : s.p == 0.0f);
	layer_spec_format(&s, buf, sizeof(buf));
	FUZZ_CHECK(layer_spec_parse(&back, buf, err, sizeof(err)) == 0);
	FUZZ_CHECK(back.kind == s.kind && back.units == s.units && back.k == s.k &&
		   back.stride == s.stride && back.pad == s.pad && back.p == s.p &&
		   memcmp(&back.embed, &s.embed, sizeof(s.embed)) == 0);
	return 0;
}
