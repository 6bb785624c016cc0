#!/bin/sh
# Test hook that writes 1 MiB to stdout and to stderr without reading its stdin; the runner
# keeps only max_output_bytes of it and must not deadlock.
head -c 1048576 /dev/zero | tr '\0' 'o'
head -c 1048576 /dev/zero | tr '\0' 'e' >&2
exit 3
