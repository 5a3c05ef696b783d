/* A set of row ids, strictly ascending, in about a quarter of their bytes.
 *
 * SPULL and SPUSH name each row of a batch by its global id, a u64: a
 * CTR batch's 1,100 rows on one ps are 8.8 KB each way, each step, where
 * the link limits the step (bench/netlab_ctr). Ascending ids are sparse
 * in a wide range, so what is between them is small: a gap of a few
 * thousand rows in a shard of millions. So the first id travels as
 * itself, each later one as its distance to the one before less one (it
 * is at least 1), each number as a LEB128 varint: 7 bits a byte, low
 * group first, bit 7 set on every byte but a number's last. A gap under
 * 16,384 takes 2 bytes.
 *
 * Each number has one writing (no trailing zero groups: a number's last
 * byte is not 0 unless it is the number's only byte; at most 10 bytes,
 * the tenth at most 1), every id stays below 2^64, and a packing is used
 * only where it is shorter than the ids as u64s: idpack_check refuses
 * anything else, so that a checked body decodes to exactly N ids and
 * packs back to the same bytes. */
#ifndef PSTRAIN_NET_IDPACK_H
#define PSTRAIN_NET_IDPACK_H

#include <stddef.h>
#include <stdint.h>

/* Packs ids[0 .. n) (n > 0, strictly ascending) into dst, at most cap
 * bytes. Returns the bytes written, or 0 if they would take more than
 * cap or not fewer than 8n, or the ids do not ascend. */
size_t idpack_encode(uint8_t *dst, size_t cap, const uint64_t *ids, size_t n);

/* How many bytes at src (at most len) are a packing of n > 0 ids, in
 * *used, with the first and last id; -1 if no prefix of them is one
 * idpack_encode writes (an unfinished or overlong number, an id past
 * 2^64 - 1, or a packing not shorter than 8n). */
int idpack_check(const uint8_t *src, size_t len, size_t n, size_t *used, uint64_t *first, uint64_t *last);

/* The n ids of a checked packing into dst. */
void idpack_decode(uint64_t *dst, const uint8_t *src, size_t n);

#endif
