"""The engine: the in-process API (add, query, status, clusters, log, revert, recluster,
archive, round) that the socket server, the evaluation and the tests use. `core` composes the
store, the writer, the index snapshots, ingest and the organizer; around it, one module per
job: `recovery` (what a killed daemon left), `warmstart` (the pickled state for a fast start),
`loader` (a full load from the YAML files), `routing` (route-pass bookkeeping), `outside`
(hand edits and git commands), `archive`, `history` (revert), `summary` (what status shows),
`stats` (access statistics, runtime state) and `hooks` (what the daemon plugs in)."""
