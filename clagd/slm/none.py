"""The `none` backend: no model. It says so the way the other backends say what they are
(`name`, `model`, `available()`), so a session holding it runs the same path as with a model:
`clagd.organize.organizers.organizer_for` gives it the lexical organizer, which makes plans
without asking anything.

It is what `backend.kind: none` means, what `auto` amounts to when no SLM answers, and what a
session names in its trailers (`Clagd-Backend: none`, `Clagd-Model: lexical`) when the lexical
organizer made the plan, also as the fallback of a model whose plans failed twice.
"""

from __future__ import annotations

from typing import Any

from clagd.errors import BackendError
from clagd.slm.base import ChatResult

NAME = "none"
MODEL = "lexical"


class NoneBackend:
    """No model: nothing to load, nothing to ask, always available."""

    name = NAME
    model = MODEL
    context_tokens = 0
    seed = 0

    def available(self) -> tuple[bool, str]:
        return True, "no model: the lexical organizer makes the plans"

    def chat_json(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        seed: int | None = None,
        timeout: float | None = None,
    ) -> ChatResult:
        """There is no model to ask: callers choose the lexical path instead of calling this."""
        raise BackendError("backend none has no model to ask")

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """No model, no tokenizer: nothing is ever sent."""
        return 0

    def close(self) -> None:
        """Nothing to release."""
