"""Conversation turns as memories: chat messages as an agent holds them
(`[{"role": "user", "content": ..., "created_at": ...}, ...]`, as mem0's `add(messages)`
takes them), one memory per turn, with no model extraction.

Each turn becomes an item whose metadata says who spoke: `role` (user, assistant, system,
tool) and `speaker` (the message's `speaker` or `name`, else its role). Which roles are
stored is the engine's choice (`ingest.assistant_turns`): user turns always, assistant
turns when configured, system and tool turns never; `Item.role` marks an item as a turn so
that only turns are ever left out. A conversation is a list of messages, or an object
`{"messages": [...], "metadata": {...}, "created_at": ...}` whose metadata and time every
turn without its own takes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clagd.errors import InboxRejected
from clagd.ingest.inbox import Item, validate_item

ROLES = ("user", "assistant", "system", "tool")
STORED_ALWAYS = frozenset({"user"})
_OWN_KEYS = {"role", "content", "created_at", "metadata", "speaker", "name"}
_CONVERSATION_KEYS = {"messages", "metadata", "created_at"}


def is_turn(raw: object) -> bool:
    """A mapping with a `role` key is a chat message, whatever else it holds."""
    return isinstance(raw, Mapping) and "role" in raw


def is_conversation(raw: object) -> bool:
    """An object holding `messages` (a conversation with its own metadata)."""
    return isinstance(raw, Mapping) and "messages" in raw


def stored_roles(assistant_turns: bool) -> frozenset[str]:
    """The roles whose turns become memories (`ingest.assistant_turns`)."""
    return STORED_ALWAYS | {"assistant"} if assistant_turns else STORED_ALWAYS


def conversation_items(
    raw: Mapping[str, Any], where: str = "file", scope: str | None = None
) -> list[Item]:
    """The turns of a conversation object, each with its metadata, time and scope (the
    object's `scope`, which must agree with `scope`, the file's folder's)."""
    extra = set(raw) - _CONVERSATION_KEYS - {"scope"}
    if extra:
        raise InboxRejected(
            f"{where}: a conversation holds 'messages', 'metadata', 'created_at' (and 'scope'),"
            f" not {', '.join(sorted(map(repr, extra)))}"
        )
    messages = raw["messages"]
    if not isinstance(messages, list) or not messages:
        raise InboxRejected(f"{where}: 'messages' must be a non-empty list of chat messages")
    meta = raw.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise InboxRejected(f"{where}: 'metadata' must be a mapping")
    shared = {k: raw[k] for k in ("created_at", "scope") if raw.get(k) is not None}
    return turn_items(messages, meta, shared, scope)


def turn_items(
    messages: Sequence[object],
    metadata: Mapping[str, Any] | None = None,
    shared: Mapping[str, Any] | None = None,
    scope: str | None = None,
) -> list[Item]:
    """One item per message, in order (`message N` names a bad one)."""
    return [
        turn_item(m, f"message {i + 1}", metadata, shared, scope) for i, m in enumerate(messages)
    ]


def turn_item(
    raw: object,
    where: str,
    metadata: Mapping[str, Any] | None = None,
    shared: Mapping[str, Any] | None = None,
    scope: str | None = None,
) -> Item:
    """One chat message as an item with `role` and `speaker` metadata, in `scope` (its own
    `scope` key must agree, as an item's does: `inbox.item_scope`); InboxRejected names
    what is wrong with it."""
    if not isinstance(raw, Mapping):
        raise InboxRejected(f"{where}: a chat message is a mapping, got {type(raw).__name__}")
    role = raw.get("role")
    if not isinstance(role, str) or role.strip().lower() not in ROLES:
        raise InboxRejected(f"{where}: 'role' must be one of {', '.join(ROLES)}, got {role!r}")
    role = role.strip().lower()
    own = raw.get("metadata") or {}
    if not isinstance(own, Mapping):
        raise InboxRejected(f"{where}: 'metadata' must be a mapping")
    speaker = raw.get("speaker") or raw.get("name") or role
    if not isinstance(speaker, str):
        raise InboxRejected(f"{where}: 'speaker' must be a string, got {type(speaker).__name__}")
    item: dict[str, Any] = {
        **(shared or {}),
        **{k: v for k, v in raw.items() if k not in _OWN_KEYS},
    }
    item["content"] = _text(raw.get("content"), where)
    if raw.get("created_at") is not None:
        item["created_at"] = raw["created_at"]
    item["metadata"] = {**(metadata or {}), **own, "role": role, "speaker": speaker}
    out = validate_item(item, where, scope)
    out.role = role
    return out


def _text(content: object, where: str) -> str:
    """A message's text: a string, or the text parts of a list of content parts
    (`[{"type": "text", "text": ...}]`, the OpenAI form), joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p["text"]
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        if texts:
            return "\n".join(texts)
        raise InboxRejected(f"{where}: 'content' has no text part")
    if content is None:
        raise InboxRejected(f"{where}: no 'content'")
    raise InboxRejected(f"{where}: 'content' must be a string, got {type(content).__name__}")
