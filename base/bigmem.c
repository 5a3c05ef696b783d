/* Huge-page regions for large tables; see bigmem.h. */
#include "bigmem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

static size_t bigmem_len(size_t bytes)
{
	return (bytes + BIGMEM_PAGE - 1) & ~(BIGMEM_PAGE - 1);
}

void *bigmem_alloc(size_t bytes)
{
	if (bytes < BIGMEM_MIN)
		return calloc(bytes ? bytes : 1, 1);
	size_t len = bigmem_len(bytes);
	if (len < bytes || len + BIGMEM_PAGE < len)
		return NULL;
	/* One page more than asked, so that a 2 MiB boundary lies inside;
	 * what falls either side of the aligned region goes back. */
	char *map = mmap(NULL, len + BIGMEM_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED)
		return NULL;
	uintptr_t at = ((uintptr_t)map + BIGMEM_PAGE - 1) & ~(uintptr_t)(BIGMEM_PAGE - 1);
	char *p = (char *)at;
	size_t head = (size_t)(p - map), tail = BIGMEM_PAGE - head;
	if (head)
		munmap(map, head);
	if (tail)
		munmap(p + len, tail);
	if (BIGMEM_HUGE)
		madvise(p, len, MADV_HUGEPAGE); /* advice: refused where THP is off */
	return p;
}

void bigmem_free(void *p, size_t bytes)
{
	if (!p)
		return;
	if (bytes < BIGMEM_MIN)
		free(p);
	else
		munmap(p, bigmem_len(bytes));
}
