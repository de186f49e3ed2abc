"""YAML in and out: the C loader/dumper when present, stable key order, aliases refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

try:
    from yaml import CSafeDumper as _Dumper
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeDumper as _Dumper  # type: ignore[assignment]
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]


class YamlError(ValueError):
    """The text is not YAML clagd accepts (syntax error, or an alias)."""


_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_MERGE = "tag:yaml.org,2002:merge"
_Scalar, _Mapping, _Sequence = yaml.ScalarNode, yaml.MappingNode, yaml.SequenceNode


class _FastLoader(_Loader):
    """The safe loader, with plain strings, mappings and lists built by one tight recursive
    function instead of PyYAML's generic constructor (generators, per-node bookkeeping),
    which was most of the time of loading a large store. Every other node — numbers, bools,
    null, timestamps, merge keys, explicit tags — goes through SafeConstructor unchanged, so
    the result is the same. Only for alias-free documents (`loads` refuses aliases first):
    a node shared through an alias would be built twice here."""

    _tag_cache: dict[str, str] = {}
    unique_keys = False  # True: a key given twice in one mapping is an error

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
        # the implicit tag of a plain scalar depends only on its text: cache the short ones
        # (keys and small values repeat in every memory); quoted scalars are always strings
        if kind is _Scalar:
            if not implicit[0]:
                return _STR
            if len(value) <= 32:
                cache = self._tag_cache
                tag = cache.get(value)
                if tag is None:
                    if len(cache) > 4096:
                        cache.clear()
                    tag = cache[value] = super().resolve(kind, value, implicit)
                return tag
        return super().resolve(kind, value, implicit)

    def construct_document(self, node: yaml.Node) -> Any:
        try:
            return self._build(node)
        finally:
            self.constructed_objects = {}
            self.recursive_objects = {}
            self.state_generators = []
            self.deep_construct = False

    def _build(self, node: yaml.Node) -> Any:
        cls, tag = type(node), node.tag
        if cls is _Scalar and tag == _STR:
            return node.value
        if cls is _Sequence and tag == _SEQ:
            build = self._build
            return [build(child) for child in node.value]
        if cls is _Mapping and tag == _MAP:
            out: dict[Any, Any] = {}
            build = self._build
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE:
                    return self.construct_object(node, deep=True)
                key = build(key_node)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        "found unhashable key",
                        key_node.start_mark,
                    ) from None
                if self.unique_keys and key in out:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found the key {key!r} twice",
                        key_node.start_mark,
                    )
                out[key] = build(value_node)
            return out
        return self.construct_object(node, deep=True)


def _check_no_alias(text: str) -> None:
    # The C loader resolves aliases internally; refuse them by scanning events first,
    # which is cheap and protects against "billion laughs" expansion.
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            raise YamlError(f"YAML aliases are not accepted (line {line})")


class _UniqueKeyLoader(_FastLoader):
    unique_keys = True


def loads(text: str, unique_keys: bool = False) -> Any:
    """Parse YAML with the safe loader; aliases are refused (YamlError). `unique_keys`: a
    key twice in one mapping is an error (for configuration, where "the last one wins"
    would silently ignore a setting)."""
    try:
        if "*" in text:
            _check_no_alias(text)
        loader = _UniqueKeyLoader if unique_keys else _FastLoader
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:  # "in "<unicode string>", line 3": the caller names the file
        raise YamlError(
            " ".join(str(exc).replace('in "<unicode string>", ', "at ").split())
        ) from None
    except RecursionError:
        # libyaml refuses nesting past 1000 levels itself; between Python's recursion limit
        # and that, building the nested lists and mappings would overflow the stack
        raise YamlError("nested too deeply") from None


def dumps(data: Any) -> str:
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )


class _NoAliasDumper(_Dumper):
    """Never anchors an object that occurs twice: `list_items` dumps many independent
    items in one document, and an alias from one item to another would not survive the
    split (`loads` refuses aliases anyway)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def list_items(items: list[Any]) -> list[str] | None:
    """The YAML text of each item as an element of a top-level block list ("- ..."),
    exactly what `dumps([item])` gives for it, from one dump of all of them: one dumper
    instead of one per item (~40% faster for memories). The items are split where a line
    starts with "- " (every other line of a block list item is indented); None when that
    does not give one part per item."""
    if not items:
        return []
    text = yaml.dump(
        items,
        Dumper=_NoAliasDumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )
    if not text.startswith("- "):
        return None
    return _items_from(text, 0, len(items))


def _items_from(text: str, start: int, count: int) -> list[str] | None:
    """`text[start:]`, a top-level block list, cut where a line starts with "- " (every
    other line of an item is indented); None when that does not give `count` parts."""
    starts = [start]
    find = text.find
    pos = find("\n- ", start)
    while pos >= 0:
        starts.append(pos + 1)
        pos = find("\n- ", pos + 1)
    if len(starts) != count:
        return None
    starts.append(len(text))
    return [text[a:b] for a, b in zip(starts, starts[1:])]


# a line inside a top-level block list written by `dumps`: an item's first line ("- ") or a
# line of it ("  "); anything else (a comment or a key at the left margin, a blank line,
# the end of the list) follows the match
_NOT_ITEM_LINE = re.compile(r"\n(?!- |  |\Z)")


def block_list_texts(text: str, key: str, count: int) -> list[str] | None:
    """The text of each item of the block list under the top-level `key` of this document,
    as `list_items` gives it, read off the document's own text: for a list of `count`
    items that runs to the end of the document, every line of it an item's first line
    ("- ") or indented ("  "), as `dumps` writes it. None for any other layout (a flow
    list, an indented list, comments or blank lines at the margin, CR line ends, another
    key after the list), or when the split does not give `count` parts. Each part parses,
    as an item of any top-level block list, to the same value as here, so a writer may put
    it back unchanged instead of dumping the value again."""
    head = key + ":\n"
    if text.startswith(head):
        start = len(head)
    else:
        pos = text.find("\n" + head)
        if pos < 0:
            return None
        start = pos + 1 + len(head)
    if count <= 0 or not text.startswith("- ", start) or not text.endswith("\n"):
        return None
    if "\r" in text or _NOT_ITEM_LINE.search(text, start - 1 if start else 0) is not None:
        return None
    return _items_from(text, start, count)


def load_yaml_file(path: Path, unique_keys: bool = False) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(f"not UTF-8: {exc}") from None
    return loads(text, unique_keys=unique_keys)
