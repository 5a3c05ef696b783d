/* libFuzzer harness for layer_spec_parse: the input is the text after
 * "layer =". A success must format back to text that parses to the same
 * spec; a failure is one line of text. */
#include "model.h"
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
	FUZZ_CHECK(s.kind == LAYER_DENSE || s.kind == LAYER_RELU ||
		   s.kind == LAYER_TANH || s.kind == LAYER_SIGMOID);
	FUZZ_CHECK(s.kind != LAYER_DENSE ? s.units == 0 : s.units >= 1);
	layer_spec_format(&s, buf, sizeof(buf));
	FUZZ_CHECK(layer_spec_parse(&back, buf, err, sizeof(err)) == 0);
	FUZZ_CHECK(back.kind == s.kind && back.units == s.units);
	return 0;
}
