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

core="$(ls -t "$out"/snapshots/*-double-free/core* | head -n 1)"
echo "== forensics inspect $core"
forensics inspect "$core"

# The block's address, as a script would get it, then the question a person
# debugging the crash asks: who owns this pointer?
addr="$(forensics inspect --json "$core" | python3 -c 'import json, sys; print(json.load(sys.stdin)["anomalies"][0]["address"])')"
echo "== forensics whoowns $addr --core $core"
forensics whoowns "$addr" --core "$core" || true
