"""Retrieval: immutable BM25 index snapshots over clusters and memories (`index`), read
without locks by every query and swapped in by the writer after each commit, and the optional
model refinement of the cluster choice at query time (`refine`). Imports core and `slm`."""
