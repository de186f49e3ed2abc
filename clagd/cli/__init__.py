"""The `clagd` command: a thin edge over the client library (and the engine for `init`
and `eval`). Errors are one line on stderr and a non-zero exit. `base` holds the context,
exit statuses and output; each other module adds its commands to `main` when imported:
`serving` (init, run, follow, sync, install-service, mcp), `memories` (add, import, query,
export), `reading` (get, list, and query's --where), `inspect` (status, clusters, log),
`organizing` (revert, recluster, archive), `forgetting` (forget) and `models` (backend, doctor, eval, model)."""

from __future__ import annotations

from clagd.cli import forgetting, inspect, memories, models, organizing, reading, serving
from clagd.cli.base import (
    EXIT_BAD_CONFIG,
    EXIT_ERROR,
    EXIT_NOT_RUNNING,
    EXIT_USAGE,
    MCP_HINT,
    Ctx,
    echo,
    main,
    terminal_safe,
)

__all__ = [
    "EXIT_BAD_CONFIG",
    "EXIT_ERROR",
    "EXIT_NOT_RUNNING",
    "EXIT_USAGE",
    "MCP_HINT",
    "Ctx",
    "echo",
    "forgetting",
    "inspect",
    "main",
    "memories",
    "models",
    "organizing",
    "reading",
    "serving",
    "terminal_safe",
]
