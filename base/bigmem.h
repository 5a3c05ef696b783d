/* Memory for tables far larger than the caches that are read at random
 * rows: the embedding tables and their optimizer state. In 4 KiB pages,
 * nearly every row a step touches misses the TLB and walks page tables
 * that miss the caches themselves; in 2 MiB pages a ps's 1.3 GiB shard
 * takes about 650 TLB entries, which a current core's second-level TLB
 * holds. So a region of at least BIGMEM_MIN is mapped 2 MiB-aligned and
 * marked MADV_HUGEPAGE: Debian's kernels default to transparent huge
 * pages only where asked ("madvise"). Where the kernel has none, or no
 * huge page is free, the region is ordinary pages and works the same. */
#ifndef PSTRAIN_BASE_BIGMEM_H
#define PSTRAIN_BASE_BIGMEM_H

#include <stddef.h>

/* BIGMEM_HUGE=0 builds the same regions without the advice, for a before
 * and after on one machine (bench/rows_step_4k). */
#ifndef BIGMEM_HUGE
#define BIGMEM_HUGE 1
#endif

#define BIGMEM_PAGE ((size_t)2 << 20)
#define BIGMEM_MIN BIGMEM_PAGE

/* Zero-filled memory for bytes, or NULL. Below BIGMEM_MIN, calloc's;
 * free it with bigmem_free and the same bytes. */
void *bigmem_alloc(size_t bytes);
void bigmem_free(void *p, size_t bytes);

#endif
