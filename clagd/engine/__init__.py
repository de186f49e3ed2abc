"""The engine: the in-process API (add, query, status, clusters, log, revert, recluster,
archive, round) that the socket server, the evaluation and the tests use. It composes the
store, the writer, the index snapshots, ingest and the organizer; `loader` performs a full
load from the YAML files, `stats` keeps access statistics as runtime state."""
