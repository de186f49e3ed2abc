"""Small-language-model backends behind one protocol (`base.Backend`): `ollama`, `llamacpp`
(a child process over a local GGUF), and `none`, the lexical organizer's stand-in. `manager`
decides which backend is active and why, and re-checks it. This layer imports only the core
modules: it knows how to ask a model for schema-constrained JSON, not what a plan is."""
