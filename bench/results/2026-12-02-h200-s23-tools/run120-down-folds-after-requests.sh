#!/usr/bin/env bash
# Session 23, call 3: the decode `down` with its folds (router weight x w2 scale) loaded after
# its first w2 requests, against HEAD (as run, the working tree held the change; the patch
# reproduces it). Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~5 min.
set -u
cd "$(dirname "$0")"
bash decode-patch-ab.sh bench/results/2026-12-02-h200-s23-patches/decode-down-folds-after-first-requests.patch
