/* Leak checks that Criterion cannot miss.
 *
 * Criterion ignores LeakSanitizer's report at process exit (and assertions
 * made in .fini), so under `make asan` a leaking test would still pass. A
 * suite that sets `.fini = leak_check` runs LSan at the end of each test and
 * aborts if anything leaked, which Criterion reports as a crash. */
#ifndef PSTRAIN_TEST_LEAK_H
#define PSTRAIN_TEST_LEAK_H

#include <stdlib.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
static inline void leak_check(void)
{
	if (__lsan_do_recoverable_leak_check())
		abort();
}
#else
static inline void leak_check(void)
{
}
#endif

#endif
