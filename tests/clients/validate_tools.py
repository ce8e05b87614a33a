"""Validates GET /v1/tools output against the format a model API expects.

Usage: validate_tools.py openai|anthropic JSON. Exits non-zero with the first error.
The schemas below are the shapes each API documents for its `tools` parameter; each
tool's own parameter schema must itself be a valid JSON Schema (Draft 2020-12).
"""

import json
import sys

import jsonschema

FUNCTION = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"type": "string", "minLength": 1},
        "parameters": {"type": "object", "properties": {"type": {"const": "object"}}, "required": ["type"]},
    },
    "required": ["name", "description", "parameters"],
    "additionalProperties": False,
}

SCHEMAS = {
    "openai": {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "properties": {"type": {"const": "function"}, "function": FUNCTION},
            "required": ["type", "function"],
            "additionalProperties": False,
        },
    },
    "anthropic": {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                "description": {"type": "string", "minLength": 1},
                "input_schema": {"type": "object", "properties": {"type": {"const": "object"}}, "required": ["type"]},
            },
            "required": ["name", "description", "input_schema"],
            "additionalProperties": False,
        },
    },
}


def main(fmt, text):
    tools = json.loads(text)
    jsonschema.validate(tools, SCHEMAS[fmt])
    for tool in tools:
        params = tool["function"]["parameters"] if fmt == "openai" else tool["input_schema"]
        jsonschema.Draft202012Validator.check_schema(params)
        # The schema accepts an example call and rejects a call missing a required field.
        validator = jsonschema.Draft202012Validator(params)
        for field in params.get("required", []):
            assert not validator.is_valid({}), f"{field} is required but {{}} validates"
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
