"""Domain exceptions. Only the CLI edge turns them into exit codes and one-line messages."""

from __future__ import annotations


class ClagdError(Exception):
    """Base of every error clagd raises on purpose. `code` is what the socket protocol sends."""

    code = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(ClagdError):
    code = "config"


class StoreError(ClagdError):
    code = "store"


class GitFailed(StoreError):
    """A git command in the store failed. The message is git's reason (its stderr's first
    line, or its exit status), never its argv; `stderr` and `status` are git's own."""

    def __init__(self, message: str, stderr: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.status = status


class HeadMoved(ClagdError):
    """The daemon's branch moved (a reset, rebase, amend, a person's commit) between the
    daemon's last load and its commit: the commit was not made; reload and retry."""

    code = "conflict"


class Paused(ClagdError):
    """Writes wait: the store's git is busy with something of the person's (detached HEAD,
    another branch, a merge or rebase in progress). The message says how to resume."""

    code = "paused"


class StoreLocked(StoreError):
    code = "locked"


class InboxRejected(ClagdError):
    """A file (or one item in it) that cannot become a memory; the message is the reason."""

    code = "invalid_memory"


class ReadOnly(ClagdError):
    """A write asked of a follower (a read-only daemon serving its primary's remote); the
    message names the primary's remote, where writes go."""

    code = "read_only"


class BadRequest(ClagdError):
    code = "bad_request"


class BadScope(BadRequest):
    """A scope name that breaks the rule (`clagd.scopes.SCOPE_RULE`); the message names
    the value given."""

    code = "bad_scope"


class NotFound(ClagdError):
    code = "not_found"


class Conflict(ClagdError):
    code = "conflict"


class BackendError(ClagdError):
    """An SLM backend failed: unreachable, timed out, missing model, bad answer.

    `prompt_tokens` / `completion_tokens` are what the failed call cost when the server said
    (an answer that did not parse still used the model), so a session can count them."""

    code = "backend"

    def __init__(
        self,
        message: str,
        code: str | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        super().__init__(message, code)
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


class BackendClosed(BackendError):
    """The backend was closed (clagd is stopping): the call started no model. Its code
    stays `backend` (a backend that is not available)."""


class DaemonNotRunning(ClagdError):
    code = "not_running"
