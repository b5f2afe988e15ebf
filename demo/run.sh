#!/usr/bin/env bash
# The demo: build a program with a real double free and run it under forensics.
# Needs the package installed first (pip install .).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/out"
mkdir -p "$out"

gcc -g -O1 -finstrument-functions -fno-omit-frame-pointer \
    -o "$out/buggy" "$here/buggy.c"

echo "== forensics run -- buggy (snapshots in $out/snapshots)"
status=0
forensics run --dir "$out/snapshots" -- "$out/buggy" || status=$?
echo "== buggy exited with status $status"

echo "== snapshots taken:"
ls -l "$out/snapshots"
# TODO(lead): forensics inspect "$out"/snapshots/core.* ; forensics whoowns ...
