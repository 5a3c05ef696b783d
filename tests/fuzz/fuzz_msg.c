/* libFuzzer harness for the message decoders of net/msg.c. The input is one
 * message body, given to msg_type and to every decoder. Checks the error
 * contract (negative errno, one line), that whatever a decoder accepts
 * re-encodes to exactly the input bytes (the encoding is canonical: there is
 * one byte string per message), and that an accepted PARAMS/PUSH chunk
 * passes a fresh assembly for [0, offset + count) exactly when its offset
 * is 0, completing it. */
#include "../../net/msg.h"
#include "fuzz.h"

#include <errno.h>

static float floats[MSG_CHUNK_FLOATS];
static uint8_t re[MSG_CHUNK_BYTES_MAX];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

static void same(int rc, size_t relen, const uint8_t *data, size_t size)
{
	FUZZ_CHECK(rc == 0);
	FUZZ_CHECK(relen == size);
	FUZZ_CHECK(memcmp(re, data, size) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	size_t relen = 0;
	int rc;

	err[0] = '\0';
	rc = msg_type(data, size, err, sizeof err);
	if (rc < 0)
		fuzz_check_err(rc, err);
	else
		FUZZ_CHECK(rc >= WIRE_PULL && rc <= WIRE_MSG_LAST && rc == data[0]);

	struct msg_pull pull;
	err[0] = '\0';
	if ((rc = msg_decode_pull(data, size, &pull, err, sizeof err)) == 0)
		same(msg_encode_pull(re, sizeof re, &pull, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_chunk c;
	err[0] = '\0';
	if ((rc = msg_decode_chunk(data, size, &c, err, sizeof err)) == 0) {
		struct msg_assembly a;
		FUZZ_CHECK(c.count >= 1 && c.count <= MSG_CHUNK_FLOATS);
		FUZZ_CHECK(size == MSG_CHUNK_BYTES(c.count));
		msg_chunk_floats(floats, &c);
		same(msg_encode_chunk(re, sizeof re, &c, floats, &relen, err, sizeof err), relen,
		     data, size);
		FUZZ_CHECK(msg_assembly_init(&a, c.type, c.shard, c.offset + c.count, err,
					     sizeof err) == 0);
		rc = msg_assembly_add(&a, &c, NULL, err, sizeof err);
		if (c.offset == 0) {
			FUZZ_CHECK(rc == 1);
		} else {
			FUZZ_CHECK(rc == -EPROTO);
			fuzz_check_err(rc, err);
		}
	} else {
		fuzz_check_err(rc, err);
	}

	struct msg_ack ack;
	err[0] = '\0';
	if ((rc = msg_decode_ack(data, size, &ack, err, sizeof err)) == 0)
		same(msg_encode_ack(re, sizeof re, &ack, &relen, err, sizeof err), relen, data, size);
	else
		fuzz_check_err(rc, err);

	struct msg_checkpoint ck;
	err[0] = '\0';
	if ((rc = msg_decode_checkpoint(data, size, &ck, err, sizeof err)) == 0)
		same(msg_encode_checkpoint(re, sizeof re, &ck, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_status st;
	err[0] = '\0';
	if ((rc = msg_decode_status(data, size, &st, err, sizeof err)) == 0)
		same(msg_encode_status(re, sizeof re, &st, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_done dn;
	err[0] = '\0';
	if ((rc = msg_decode_done(data, size, &dn, err, sizeof err)) == 0)
		same(msg_encode_done(re, sizeof re, &dn, &relen, err, sizeof err), relen, data, size);
	else
		fuzz_check_err(rc, err);

	struct msg_heartbeat hb;
	err[0] = '\0';
	if ((rc = msg_decode_heartbeat(data, size, &hb, err, sizeof err)) == 0)
		same(msg_encode_heartbeat(re, sizeof re, &hb, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	struct msg_rollback rb;
	err[0] = '\0';
	if ((rc = msg_decode_rollback(data, size, &rb, err, sizeof err)) == 0)
		same(msg_encode_rollback(re, sizeof re, &rb, &relen, err, sizeof err), relen, data,
		     size);
	else
		fuzz_check_err(rc, err);

	static struct msg_error e;
	err[0] = '\0';
	if ((rc = msg_decode_error(data, size, &e, err, sizeof err)) == 0) {
		FUZZ_CHECK(strlen(e.text) <= WIRE_ERROR_TEXT_MAX);
		same(msg_encode_error(re, sizeof re, e.code, e.text, &relen, err, sizeof err), relen,
		     data, size);
	} else {
		fuzz_check_err(rc, err);
	}
	return 0;
}
