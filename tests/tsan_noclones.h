/* Included first in every file of a SAN=thread build (Makefile): the ifunc
 * resolvers of target_clones run before ThreadSanitizer's runtime is up
 * and crash, so the clones become plain functions, as in the fuzz builds. */
#define target_clones(...) __unused__
