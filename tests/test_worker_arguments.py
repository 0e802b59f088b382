"""The worker's own checks of the model's arguments (`workers.execute.Executor`).

A message may come from a client that checks less (an older one, or a platform
publishing by hand): the worker refuses, as a result, arguments over the
agent's `max_argument_bytes`, nested too deeply, or holding what JSON cannot.
No runner is needed: every refusal comes before one would start.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import EXAMPLES

from broker.errors import RefusedCall
from broker.loading import load_deployment
from broker.request import CallRequest
from broker.result import ToolResult
from workers.arguments import parse_arguments
from workers.execute import Executor


@pytest.fixture(scope="module")
def executor() -> Executor:
    return Executor(load_deployment(EXAMPLES / "deployment.toml"))


def run(executor: Executor, arguments: object) -> ToolResult:
    request = CallRequest(
        call_id="c-1", agent="field-guide", tool="species", arguments=arguments, owner="web/a"
    )
    return executor.run(request)


def refused(executor: Executor, arguments: object) -> str:
    result = run(executor, arguments)
    assert (result.outcome, result.is_error) == ("refused", True), result
    return result.output


def test_arguments_within_the_checks_reach_the_runner(executor: Executor) -> None:
    result = run(executor, '{"habitat": "rivers"}')
    assert result.output == "species: this worker runs no declared tools"


@pytest.mark.parametrize("as_text", [True, False])
def test_arguments_over_the_cap_are_refused(executor: Executor, as_text: bool) -> None:
    value = {"habitat": "x" * 1_000_000}
    arguments = json.dumps(value, separators=(",", ":")) if as_text else value
    assert refused(executor, arguments) == (
        "species: the arguments are 1000014 bytes; at most 1000000 bytes may be given; "
        "call species again with smaller arguments."
    )


@pytest.mark.parametrize("levels", [65, 200, 100_000])
def test_deep_nesting_is_refused_as_invalid_arguments(executor: Executor, levels: int) -> None:
    # 100,000 levels made json.loads raise RecursionError: "the worker failed to run this call".
    text = '{"habitat": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"
    assert refused(executor, text) == (
        "species: the arguments are nested more than 64 levels deep; "
        "call species again with flatter arguments."
    )


def test_sixty_four_levels_are_accepted(executor: Executor) -> None:
    text = '{"x": ' + "[" * 63 + "]" * 63 + "}"
    assert run(executor, text).output == "species: this worker runs no declared tools"


def test_a_recursive_schema_validates_the_deepest_accepted_arguments() -> None:
    # jsonschema recurses several frames per level of a $ref'd schema: 64
    # levels stay well inside Python's limit.
    tool = load_deployment(EXAMPLES / "deployment.toml").agent("field-guide").tools["species"]
    tree = {
        "$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/node"}},
    }
    recursive = dataclasses.replace(tool, parameters=tree)
    nested = "[" * 63 + "]" * 63
    assert parse_arguments(recursive, '{"x": ' + nested + "}") == {"x": json.loads(nested)}
    with pytest.raises(RefusedCall, match="nested more than 64 levels"):
        parse_arguments(recursive, '{"x": [' + nested + "]}")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_text_are_refused(executor: Executor, constant: str) -> None:
    assert refused(executor, f'{{"habitat": {constant}}}') == (
        f"species: the arguments hold {constant}, which is not JSON; "
        "call species again with valid JSON."
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_decoded_floats_are_refused(executor: Executor, value: float) -> None:
    assert "which is not JSON" in refused(executor, {"habitat": value})


def test_a_number_too_large_for_a_double_is_refused(executor: Executor) -> None:
    assert refused(executor, '{"habitat": 1e400}') == (
        "species: the arguments hold the number 1e400, too large to read; "
        "call species again with smaller numbers (or the number as a string)."
    )


def test_an_integer_past_the_digits_limit_says_so(executor: Executor) -> None:
    text = '{"habitat": 1' + "0" * 100_000 + "}"
    assert refused(executor, text) == (
        "species: the arguments hold an integer of more than 4300 digits, more than can be "
        "read; call species again with smaller numbers (or the number as a string)."
    )


def test_text_that_is_not_json_is_still_not_an_object(executor: Executor) -> None:
    assert refused(executor, "[not json") == (
        "species: the arguments must be a JSON object; call species again with valid JSON."
    )
