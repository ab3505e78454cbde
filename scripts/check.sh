#!/usr/bin/env bash
# npm test's static checks, side by side: the type check (tsc --noEmit) and the linter (eslint).
# Exits non-zero if either fails; each prints its own findings.
set -uo pipefail
cd "$(dirname "$0")/.."
npx tsc --noEmit &
tsc=$!
npx eslint .
lint=$?
wait "$tsc"
types=$?
exit $(( types != 0 || lint != 0 ))
