"""Organizing: the clustering session. `plan` defines a plan (moves, merges, splits, names),
its JSON schema, its validation and how it is applied to the store state; `lexical` is the
organizer that needs no model; `session` samples memories, asks a backend (or the lexical
organizer), applies, commits, validates and reverts when the result is worse. Imports core,
`store`, `slm` and `retrieval`."""
