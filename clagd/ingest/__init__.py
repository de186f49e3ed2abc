"""Ingest: how memories arrive. `inbox` parses and validates inbox files and rejects bad ones
with a reason; `watcher` notices complete files (inotify or polling, plus a rescan); `batch`
is the writer operation that dedupes, routes and commits a batch, and the deferred route pass.
Imports core, `store` and `retrieval`."""
