#!/bin/sh
# Fails unless the binary's dynamic dependencies are glibc's own libraries:
# pstrain is copied to nodes as one file, so nothing else may be needed.
bin=${1:-./pstrain}
bad=$(ldd "$bin" | awk '{print $1}' | grep -v -E '^(linux-vdso\.so|/lib64/ld-linux|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so)' || true)
if [ -n "$bad" ]; then
	echo "ldd_check: $bin links non-glibc libraries dynamically: $bad" >&2
	exit 1
fi
echo "ldd_check: $bin depends only on glibc ($(ldd "$bin" | awk '{print $1}' | tr '\n' ' '))"
