"""JSON schemas for a model's answers: small builders, so every schema clagd sends reads the
same way (closed objects, enumerated ids), and the checker of the subset they use.

A constrained decoder follows the schema; a server that ignores it (old Ollama versions do) is
caught by `schema_errors`, which `base.parse_json_answer` runs on every answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

Schema = dict[str, Any]


def closed_object(properties: Schema, required: Sequence[str] | None = None) -> Schema:
    """An object with these properties and no others; all of them required unless
    `required` names which."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else list(required),
        "additionalProperties": False,
    }


def one_of(values: Sequence[str]) -> Schema:
    """Exactly one of these values (the ids a model may name)."""
    return {"enum": list(values)}


def array(items: Schema, max_items: int, min_items: int | None = None) -> Schema:
    out: Schema = {"type": "array"}
    if min_items is not None:
        out["minItems"] = min_items
    out["maxItems"] = max_items
    out["items"] = items
    return out


def string(
    *,
    enum: Sequence[str] | None = None,
    pattern: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
) -> Schema:
    out: Schema = {"type": "string"}
    if enum is not None:
        out["enum"] = list(enum)
    if pattern is not None:
        out["pattern"] = pattern
    if min_length is not None:
        out["minLength"] = min_length
    if max_length is not None:
        out["maxLength"] = max_length
    return out


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """The subset of JSON Schema clagd's schemas use: type, enum, properties, required,
    additionalProperties, items, min/maxItems, min/maxLength, pattern. Returns readable problems."""
    typ = schema.get("type")
    if typ is not None:
        allowed = _TYPES.get(typ, (object,))
        is_bool = isinstance(value, bool)
        if not isinstance(value, allowed) or (is_bool and typ in ("integer", "number")):
            return [f"{path} should be {typ}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        shown = ", ".join(map(str, schema["enum"][:8]))
        return [
            f"{path}: {value!r} is not one of [{shown}{', ...' if len(schema['enum']) > 8 else ''}]"
        ]
    if isinstance(value, dict):
        return _object_errors(value, schema, path)
    if isinstance(value, list):
        return _array_errors(value, schema, path)
    if isinstance(value, str):
        return _string_errors(value, schema, path)
    return []


def _object_errors(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    props = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            errors.append(f"{path}.{key} is missing")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            errors.extend(schema_errors(item, props[key], f"{path}.{key}"))
        elif extra is False:
            errors.append(f"{path}.{key} is not allowed")
        elif isinstance(extra, dict):
            errors.extend(schema_errors(item, extra, f"{path}.{key}"))
    return errors


def _array_errors(value: list[Any], schema: dict[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    if len(value) < schema.get("minItems", 0):
        errors.append(f"{path} needs at least {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{path} allows at most {schema['maxItems']} items")
    if "items" in schema:
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{path}[{i}]"))
    return errors


def _string_errors(value: str, schema: dict[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    if len(value) < schema.get("minLength", 0):
        errors.append(f"{path} is shorter than {schema['minLength']} characters")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{path} is longer than {schema['maxLength']} characters")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    return errors
