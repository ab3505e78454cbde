#!/usr/bin/env bash
# npm test's static checks, side by side: the type check (tsc --noEmit), the linter (eslint) and
# the layout (prettier --check; `npm run format` applies it). Exits non-zero if any fails; each
# prints its own findings.
set -uo pipefail
cd "$(dirname "$0")/.."
npx tsc --noEmit &
tsc=$!
npx prettier --check --log-level warn . &
prettier=$!
npx eslint .
lint=$?
wait "$tsc"
types=$?
wait "$prettier"
layout=$?
exit $(( types != 0 || lint != 0 || layout != 0 ))
