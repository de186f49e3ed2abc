"""The prompts a model organizer sends: the templates (user-editable in `<store>/prompts/`)
and the messages built from them for a plan (`organize.md`) and for a validation
(`validate.md`). Only text here: which memories and clusters go into a call is decided by
`clagd.organize.organizers`."""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

from clagd.errors import ClagdError
from clagd.model import Cluster, Memory, parse_time
from clagd.store.create import template_dir

if TYPE_CHECKING:
    from clagd.organize.sample import Check

Messages = list[dict[str, str]]

MEMORY_CHARS = 240
ORGANIZE_FORMAT = (
    '{"clusters": [{"id": "N1", "name": "two to five words", "description": "One sentence.", '
    '"tags": ["word"], "merge": ["C2"]}], "assign": {"M1": "C1", "M2": "N1"}, '
    '"conflicts": [{"newer": "M2", "older": "M1"}], "reason": "One short sentence."}\n'
    "ids: memories M1..M<n>; existing clusters C1..C<c>; new clusters N1..N<k>"
)
VALIDATE_FORMAT = '{"verdicts": {"A1": "yes", "A2": "no"}} with one verdict per check'


def load_prompt(prompts_dir: Path | None, name: str) -> str:
    """`<store>/prompts/<name>` (user-editable, versioned with the memories), else the copy
    shipped with clagd."""
    for d in ([Path(prompts_dir)] if prompts_dir else []) + [template_dir() / "prompts"]:
        path = d / name
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise ClagdError(f"prompt template {name} not found in {prompts_dir}")


def render(template: str, **values: str) -> str:
    return string.Template(template).safe_substitute(**values).strip()


def clip(text: str, n: int = MEMORY_CHARS) -> str:
    """`text` on one line, at most `n` characters."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _day(m: Memory) -> str:
    t = parse_time(m.created_at)
    return t.strftime("%Y-%m-%d") if t else ""


def organize_messages(
    template: str, mems: list[Memory], clusters: list[Cluster], max_new: int
) -> Messages:
    """The plan request for these memories among these clusters (aliases M, C, N)."""
    fmt = (
        ORGANIZE_FORMAT.replace("<n>", str(len(mems)))
        .replace("<c>", str(len(clusters)))
        .replace("<k>", str(max_new))
    )
    if not clusters:
        fmt = fmt.replace("existing clusters C1..C0; ", "no existing clusters; ")
    system = render(template, answer_format=fmt)
    lines = ["Existing clusters:"]
    if not clusters:
        lines.append("(none)")
    for i, c in enumerate(clusters, 1):
        ex = f' e.g. "{clip(c.memories[0].content, 80)}"' if c.memories else ""
        tags = f" [{', '.join(c.tags)}]" if c.tags else ""
        lines.append(
            f'C{i} "{c.name}": {clip(c.description, 120)}{tags} ({len(c.memories)} memories){ex}'
        )
    lines.append("Memories:")
    for i, m in enumerate(mems, 1):
        day = _day(m)
        lines.append(f"M{i}: {clip(m.content)}{f' ({day})' if day else ''}")
    if max_new:
        lines.append(f"You may create up to {max_new} new clusters (N1..N{max_new}).")
    lines.append("Answer:")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


def validate_messages(template: str, keys: list[str], checks: list[Check]) -> Messages:
    """The yes/no request: does each checked memory belong in its cluster (aliases A)."""
    lines = []
    for k, ch in zip(keys, checks):
        held = " ".join(f'"{e}"' for e in ch.examples) or "(nothing else yet)"
        lines.append(f'{k}: memory "{ch.content}"\n    cluster "{ch.cluster}". Holds: {held}')
    system = render(template, answer_format=VALIDATE_FORMAT)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "\n".join(lines) + "\nAnswer:"},
    ]
