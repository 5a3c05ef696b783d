/* base/bigmem: regions for large tables, 2 MiB-aligned, zero-filled and
 * advised into huge pages; what the kernel then gives is its own call,
 * so the tests read the advice (smaps' VmFlags "hg"), not the pages. */
#include <criterion/criterion.h>

#include "../base/bigmem.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The VmFlags line of the mapping that holds p, in flags; 0 when found. */
static int vmflags_of(const void *p, char *flags, size_t len)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int in = 0, found = -1;
	uintptr_t a = (uintptr_t)p;
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = a >= lo && a < hi;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			snprintf(flags, len, "%s", line + 8);
			found = 0;
			break;
		}
	}
	if (f)
		fclose(f);
	return found;
}

Test(bigmem, large_regions_are_aligned_zeroed_and_advised_huge)
{
	size_t bytes = 5 * BIGMEM_PAGE + 12345;
	unsigned char *p = bigmem_alloc(bytes);
	cr_assert_not_null(p);
	cr_expect_eq((uintptr_t)p % BIGMEM_PAGE, 0, "not 2 MiB-aligned: %p", (void *)p);
	size_t nonzero = 0;
	for (size_t i = 0; i < bytes; i += 4093)
		nonzero += p[i] != 0;
	cr_expect_eq(nonzero, 0, "%zu bytes not zero", nonzero);
	memset(p, 0xa5, bytes);   /* every byte asked for is ours to write */
	if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK)) {
		cr_log_warn("bigmem: this kernel has no transparent huge pages; the advice is not checked");
	} else {
		char flags[512] = "";
		cr_assert_eq(vmflags_of(p, flags, sizeof(flags)), 0, "no smaps entry for %p", (void *)p);
		cr_expect(strstr(flags, " hg") != NULL, "not advised huge: VmFlags%s", flags);
	}
	bigmem_free(p, bytes);
	char flags[512];
	cr_expect_neq(vmflags_of(p, flags, sizeof(flags)), 0, "the region is still mapped after bigmem_free");
}

Test(bigmem, small_regions_come_from_the_heap_zeroed)
{
	size_t sizes[] = { 0, 1, 4096, BIGMEM_MIN - 1 };
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		unsigned char *p = bigmem_alloc(sizes[k]);
		cr_assert_not_null(p, "%zu bytes", sizes[k]);
		for (size_t i = 0; i < sizes[k]; i++)
			cr_assert_eq(p[i], 0, "byte %zu of %zu", i, sizes[k]);
		bigmem_free(p, sizes[k]);
	}
	bigmem_free(NULL, BIGMEM_PAGE);
}

Test(bigmem, sizes_past_the_address_space_fail_cleanly)
{
	cr_expect_null(bigmem_alloc(SIZE_MAX - 100));
	cr_expect_null(bigmem_alloc(SIZE_MAX / 2));
}
