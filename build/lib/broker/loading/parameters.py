"""A tool's `parameters`: plain JSON, a valid JSON Schema, of type object.

Seed 000 passes the schema to the model as is, so it must be something a
model API accepts: JSON values only (TOML dates are not), valid against
jsonschema's meta-schema, and describing an object. In `args` mode each
property becomes a `--name=value` flag, so the names must read as one flag.
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Iterator
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from broker.constants import DEFAULT_PARAMETERS
from broker.loading.fields import Table, field_path

__all__ = ["read_parameters"]

# A flag name may not hold "=" (it would end the name early), start with "-"
# (it would read as another option) or hold spaces or control characters.
_BAD_FLAG_NAME = re.compile(r"^-|[=\s\x00-\x1f\x7f]")


def read_parameters(table: Table, *, args_mode: bool) -> dict[str, Any] | None:
    """The checked schema (a fresh copy, default `{"type":"object","properties":{}}`)."""
    if not table.has("parameters"):
        return copy.deepcopy(DEFAULT_PARAMETERS)
    schema = table.mapping("parameters")
    if schema is None:
        return None
    where = table.field("parameters")
    found = len(table.problems)
    for path in _non_json_values(schema, where):
        table.problems.add(
            table.file, path, "is a TOML date or time; a JSON Schema holds JSON only"
        )
    if len(table.problems) > found:
        return None
    message = _schema_error(schema, where)
    if message is not None:
        table.problems.add(table.file, message[0], message[1])
        return None
    if schema.get("type") != "object":
        table.problems.add(
            table.file,
            field_path(where, "type"),
            f'must be "object" (the arguments are one JSON object), not {schema.get("type")!r}',
        )
        return None
    if args_mode:
        properties = schema.get("properties", {})
        for name in properties:
            if not name or _BAD_FLAG_NAME.search(name):
                table.problems.add(
                    table.file,
                    field_path(field_path(where, "properties"), name),
                    'cannot be an argument flag with input = "args": a name may not be '
                    'empty, start with "-" or hold "=", spaces or control characters',
                )
        if len(table.problems) > found:
            return None
    return schema


def _non_json_values(value: Any, where: str) -> Iterator[str]:
    """The field path of every TOML date or time in `value`."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _non_json_values(item, field_path(where, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_json_values(item, field_path(where, index))
    elif isinstance(value, datetime.date | datetime.time):
        yield where


def _schema_error(schema: dict[str, Any], where: str) -> tuple[str, str] | None:
    """(field, message) of the first meta-schema error, or None if the schema is valid."""
    dialect = schema.get("$schema")
    if dialect is not None and not isinstance(dialect, str):
        return field_path(where, "$schema"), "must be a string naming a JSON Schema draft"
    # Without $schema: the latest draft. With one, a default of None turns an
    # unknown $schema into None here instead of a DeprecationWarning.
    validator = validator_for(schema) if dialect is None else validator_for(schema, default=None)
    if validator is None:
        unknown = f"{dialect!r} is not a JSON Schema draft jsonschema knows"
        return field_path(where, "$schema"), unknown
    try:
        validator.check_schema(schema)
    except SchemaError as exc:
        at = where
        for step in exc.absolute_path:
            at = field_path(at, step)
        return at, f"not a valid JSON Schema: {exc.message}"
    except RecursionError:
        return where, "not a valid JSON Schema: nested too deeply"
    return None
