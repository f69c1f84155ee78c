"""The agent's own JSON, base64 and sha256 (C cores, without their packages) agree with the standard library's."""

from __future__ import annotations

import base64
import hashlib
import json
import math

import pytest

from ddops.transport.agent import agent_source

VALUES = [
    None, True, False, 0, -1, 2**70, 1.5, -0.0, 1e300, 3.141592653589793, "", "plain", 'quote " and \\ backslash',
    "control \x00\x01\x1f\t\n\r", "ünïcödé ✓ and an emoji 🙂", [], {}, [1, [2, [3, {}]]], (1, "tuple"),
    {"b": 1, "a": [None, {"z": "x", "y": 2.25}], "": "empty key"},
    {"journal": [{"action": "patch", "file": "ddtree.py", "sha256": "ab" * 32, "patch_ids": ["hybrid-cache"]}]},
]


@pytest.fixture(scope="module")
def agent() -> dict:
    """The agent's globals, loaded as the bootstrap loads them."""
    namespace = {"__name__": "__ddops_agent__", "AGENT_SOURCE": agent_source()}
    exec(compile(agent_source(), "<ddops-agent>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("value", VALUES, ids=repr)
@pytest.mark.parametrize("sort_keys", [False, True])
def test_to_json_writes_what_json_dumps_writes(agent, value, sort_keys):
    assert agent["to_json"](value, sort_keys=sort_keys) == json.dumps(value, sort_keys=sort_keys)


def test_to_json_turns_non_string_keys_into_strings_as_json_dumps_does(agent):
    value = {1: "int key", 2.5: "float key", False: "bool key", None: "null key"}
    assert agent["to_json"](value) == json.dumps(value)


def test_to_json_writes_non_finite_floats_as_json_dumps_does(agent):
    for value in (math.nan, math.inf, -math.inf):
        assert agent["to_json"]([value]) == json.dumps([value])


def test_to_json_refuses_what_json_refuses(agent):
    for value in ({1, 2}, b"bytes", object(), {("tuple", "key"): 1}):
        with pytest.raises(TypeError):
            agent["to_json"](value)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_from_json_reads_what_json_loads_reads(agent, value):
    text = json.dumps(value)
    assert agent["from_json"](text) == json.loads(text)
    assert agent["from_json"](" \n\t" + text + "\r\n ") == json.loads(text)


def test_from_json_reads_non_finite_numbers(agent):
    value = agent["from_json"]("[NaN, Infinity, -Infinity]")
    assert math.isnan(value[0]) and value[1:] == [math.inf, -math.inf]


@pytest.mark.parametrize("text", ["", "   ", "{", '{"a": 1} trailing', "[1,]", "'single'", '"\\x"', "nul", "1 2"])
def test_from_json_refuses_what_json_refuses_with_json_s_message(agent, text):
    with pytest.raises(ValueError) as expected:
        json.loads(text)
    with pytest.raises(ValueError) as got:
        agent["from_json"](text)
    assert str(got.value) == str(expected.value)


def test_base64_fields_take_the_canonical_encoding_only(agent):
    data = bytes(range(256))
    text = agent["b64_text"](data)
    assert text == base64.b64encode(data).decode()
    assert agent["decode_b64"]({"content": text}, "content", "change") == data
    for bad in (text[:-1], "abc", "ab=c", "YQ", "YR==", " " + text, text + "\n", "not base64!", "é", 5):
        with pytest.raises(agent["AgentFault"]) as refused:
            agent["decode_b64"]({"content": bad}, "content", "change")
        assert refused.value.kind == "bad_request" and "change.content" in refused.value.message


@pytest.mark.parametrize("size", [0, 1, 1000, (1 << 20) - 1, 1 << 20, 3 << 20])
def test_sha256_hex_matches_hashlib_below_and_above_the_openssl_threshold(agent, size):
    data = bytes(index % 251 for index in range(size))
    assert agent["sha256_hex"](data) == hashlib.sha256(data).hexdigest()


def test_is_hex_checks_digits_case_and_length(agent):
    is_hex = agent["is_hex"]
    assert is_hex("ab" * 32, 64) and is_hex("0" * 40, 40, 64) and is_hex("0f")
    assert not is_hex("AB" * 32, 64) and not is_hex("g" * 64, 64) and not is_hex("ab" * 31, 64)
    assert not is_hex("", 0) and not is_hex(None) and not is_hex(b"ab")
