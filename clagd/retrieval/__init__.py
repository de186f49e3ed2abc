"""Retrieval: immutable BM25 index snapshots over clusters and memories, read without locks
by every query and swapped in by the writer after each commit, cut by job as a small search
engine: the snapshot and its constructors (`snapshot`, `writing` for a change, `bulk` for a
whole store), what it stores (`postings`), BM25 (`scoring`), search and its cut-offs
(`searching`), ingest routing (`routing`), result types (`results`), the one change type
(`change`), time neighbours (`timeline`) and the optional model refinement of the cluster
choice at query time (`refine`). `index` re-exports the public names. Imports core and `slm`."""
