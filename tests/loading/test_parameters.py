"""`parameters`: plain JSON, a valid JSON Schema (jsonschema's meta-schema), of type object."""

from __future__ import annotations

import pytest

from .conftest import Tree

TOOL = "guide/tools/echo.toml"
HEAD = 'name = "echo"\ndescription = "Echo."\ncommand = ["echo"]\n'
ARGS = HEAD + 'input = "args"\n'


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        (HEAD + 'parameters = "object"\n', "parameters", "must be a table, not a string"),
        (HEAD + '[parameters]\ntype = "array"\n', "parameters.type", 'must be "object"'),
        (HEAD + "[parameters]\nproperties = {}\n", "parameters.type", 'must be "object"'),
        (
            HEAD + '[parameters]\ntype = "object"\n[parameters.properties.x]\ntype = "strin"\n',
            "parameters.properties.x.type",
            "not a valid JSON Schema",
        ),
        (
            HEAD + '[parameters]\ntype = "object"\nrequired = "x"\n',
            "parameters.required",
            "not a valid JSON Schema",
        ),
        (
            HEAD + '[parameters]\ntype = "object"\nproperties = ["x"]\n',
            "parameters.properties",
            "not a valid JSON Schema",
        ),
        (
            HEAD + '[parameters]\ntype = "object"\n[parameters.properties.x]\npattern = "["\n',
            "parameters.properties.x.pattern",
            "not a valid JSON Schema",
        ),
        (
            HEAD
            + '[parameters]\ntype = "object"\n[parameters.properties.when]\ndefault = 2024-01-01\n',
            "parameters.properties.when.default",
            "a TOML date or time",
        ),
        (
            HEAD + '[parameters]\ntype = "object"\n"$schema" = "https://example.com/nope"\n',
            'parameters."$schema"',
            "not a JSON Schema draft",
        ),
        (
            HEAD + '[parameters]\ntype = "object"\n"$schema" = 7\n',
            'parameters."$schema"',
            "must be a string",
        ),
        # args mode: every property must read as one --name=value flag
        (
            ARGS
            + '[parameters]\ntype = "object"\n[parameters.properties."a=b"]\ntype = "string"\n',
            'parameters.properties."a=b"',
            "cannot be an argument flag",
        ),
        (
            ARGS + '[parameters]\ntype = "object"\n[parameters.properties."-x"]\ntype = "string"\n',
            "parameters.properties.-x",
            "cannot be an argument flag",
        ),
        (
            ARGS
            + '[parameters]\ntype = "object"\n[parameters.properties."a b"]\ntype = "string"\n',
            'parameters.properties."a b"',
            "cannot be an argument flag",
        ),
        (
            ARGS + '[parameters]\ntype = "object"\n[parameters.properties.""]\ntype = "string"\n',
            'parameters.properties.""',
            "cannot be an argument flag",
        ),
    ],
)
def test_invalid_parameters_are_refused(tree: Tree, body: str, field: str, fragment: str) -> None:
    tree.expect({TOOL: body}, TOOL, field, fragment)


def test_json_stdin_tools_may_use_any_property_name(tree: Tree) -> None:
    body = HEAD + '[parameters]\ntype = "object"\n[parameters.properties."a=b"]\ntype = "string"\n'
    tree.write({TOOL: body})
    assert "a=b" in tree.load().agent("guide").tool("echo").parameters["properties"]


def test_a_known_schema_draft_is_accepted(tree: Tree) -> None:
    draft = "http://json-schema.org/draft-07/schema#"
    tree.write({TOOL: HEAD + f'[parameters]\ntype = "object"\n"$schema" = "{draft}"\n'})
    assert tree.load().agent("guide").tool("echo").parameters["$schema"] == draft


def test_the_schema_is_given_to_the_model_as_written(tree: Tree) -> None:
    [entry] = tree.load().agent("guide").catalogue()
    assert entry == {
        "name": "echo",
        "description": "Echo the arguments.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
