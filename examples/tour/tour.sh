#!/usr/bin/env bash
# The README's "A short tour", run for real: `examples/tour/tour.sh [DIR]` (DIR: an empty
# scratch folder; default a new temporary one). It prints a transcript, each command after
# "$ " and then its output; the README shows the output of `examples/tour/tour.sh /tmp/tour`,
# and tests/test_tour.py runs this script and compares the two.
#
# Deterministic on purpose: backend `none` (the lexical organizer, no model), fixed
# created_at times on every memory, and the three inbox files renamed in with one `mv`,
# so they land in one commit. Commit ids, commit and rejection times, session ids and
# cluster ids still change from run to run (the test masks them).
#
# `clagd` is the clagd on PATH; set CLAGD to run another command instead (the tests set
# CLAGD="python -m clagd" to run the source tree). The daemon is stopped on every way out:
# success, a failed command, Ctrl-C or a kill of this script.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${1:-$(mktemp -d "${TMPDIR:-/tmp}/clagd-tour.XXXXXX")}"
mkdir -p "$WORK"
if [ -n "$(ls -A "$WORK")" ]; then
    echo "tour.sh: $WORK is not empty" >&2
    exit 64
fi
cd "$WORK"
cp "$HERE/trip.yaml" "$HERE/ana.md" "$HERE/broken.json" .
CLAGD="${CLAGD:-clagd}"
# in a background job (`clagd run ... &`) the function runs in a subshell: exec, so that the
# job is the daemon itself and `kill %1` stops it (not only the subshell around it).
# `command` runs the program, never this function again (CLAGD=clagd would recurse).
clagd() { if [ "$BASHPID" != "$$" ]; then exec $CLAGD "$@"; fi; command $CLAGD "$@"; }

LAST=""
run() {  # print "$ command", run it in this shell, print its output
    printf '$ %s\n' "$1"
    local out
    out="$(mktemp)"
    eval "$1" >"$out" 2>&1 || { cat "$out"; rm -f "$out"; echo "tour.sh: failed: $1" >&2; exit 1; }
    LAST="$(cat "$out")"
    rm -f "$out"
    [ -z "$LAST" ] || printf '%s\n' "$LAST"
}
stop_daemon() {  # every background job of this script is the daemon: stop it, wait for it
    local pids
    pids="$(jobs -p)"
    [ -z "$pids" ] || { kill $pids 2>/dev/null || true; wait $pids 2>/dev/null || true; }
}
trap stop_daemon EXIT
trap 'exit 130' INT   # a signal exits through the EXIT trap too
trap 'exit 143' TERM

run 'export CLAGD_STORE=./memory CLAGD_BACKEND=none   # backend none: the lexical organizer'
run 'clagd run ./memory >daemon.log 2>&1 &          # or as a service (docs/service.md)'
run 'until clagd status >/dev/null 2>&1; do sleep 0.2; done   # until it answers'
run 'clagd add "The user is sensitive to cold and keeps a sweater at the office" --created-at 2026-03-02T09:15:00Z'
run 'clagd add "The user asked where the heating switch is in the flat" -m importance=0.8 --created-at 2026-03-02T09:20:00Z'
run 'cat trip.yaml ana.md broken.json'
run 'mv trip.yaml ana.md broken.json memory/inbox/   # one rename each, Maildir-style'
run 'while ls memory/inbox/*.* >/dev/null 2>&1; do sleep 0.2; done   # until all are read'
run 'clagd recluster'
session="$(sed -n 's/^session \(s-[^:]*\):.*/\1/p' <<<"$LAST")"
run 'clagd query "book a flight to Lisbon"'
run 'clagd status'
run 'clagd clusters'
run 'clagd log'
run 'cat memory/inbox/rejected/broken.json.error'
run 'git -C memory log --oneline -3'
run "clagd revert $session     # undo a whole session (git revert)"
run 'clagd query "book a flight to Lisbon"'
run 'kill %1; wait   # SIGTERM: a clean stop'
