"""The store: a git repository of YAML files, and the one writer that changes it.

`files` knows the layout (clusters/, archive/, unsorted/, .clagd/) and is the one reader and
validator of store files; `durable` holds the crash-safe write primitives; `gitrepo` speaks to
git through GitPython's command wrapper (cut by job into `gitcmd`, `gitstate`, `gitrefs`,
`gitcommit`, `gitlog`; no GitPython error leaves this package); `writer` is the single thread that owns the working
tree and the git index and turns every mutation into one commit; `export` renders clusters as
Markdown. This layer imports only the core modules (errors, config, model, text, yamlio)."""
