#!/usr/bin/env bash
# Session 23, call 2: the decode `down` split over clusters of two CTAs, against HEAD (as run,
# the working tree held the change; the patch reproduces it), with the split's own tests in the
# sanitizer runs. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~5 min.
set -u
cd "$(dirname "$0")"
SANITIZE_EXTRA=':DecodeRoute.Split*' bash decode-patch-ab.sh bench/results/2026-12-02-h200-s23-patches/decode-down-split-over-cluster-pairs.patch
