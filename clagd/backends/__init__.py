"""SLM backends: `ollama`, `llamacpp` (child process), `none` (lexical), and `auto` selection."""

from .base import Backend, ChatResult, schema_errors, select_backend

__all__ = ["Backend", "ChatResult", "schema_errors", "select_backend"]
