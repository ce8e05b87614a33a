"""Tests for worker/python/tools.py (``snakecage.tools``) against a stand-in for its native
half ``_snakecage_tools``, which the real worker implements in Rust (worker/src/tools.rs):
the Python half's job is the API, JSON in and out, and exceptions."""

import json
import sys
import types
from pathlib import Path

import pytest

TOOLS_PATH = Path(__file__).resolve().parents[1] / "tools.py"

CATALOG = [
    {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}},
    {"name": "team.lookup", "description": "Namespaced", "parameters": {"type": "object"}},
]


class FakeNative:
    """Answers like the Rust half: the catalog, search, and one canned answer per call."""

    def __init__(self):
        self.sent = []
        self.answer = {"status": "ok", "result": {"temp": 21}}

    def catalog(self):
        return json.dumps(CATALOG)

    def search(self, query, limit):
        return json.dumps([t for t in CATALOG if query in t["name"]][:limit])

    def call(self, name, arguments):
        self.sent.append((name, json.loads(arguments)))
        return json.dumps(self.answer)


@pytest.fixture()
def tools(monkeypatch):
    native = FakeNative()
    fake = types.ModuleType("_snakecage_tools")
    for attr in ("catalog", "search", "call"):
        setattr(fake, attr, getattr(native, attr))
    monkeypatch.setitem(sys.modules, "_snakecage_tools", fake)
    module = types.ModuleType("snakecage.tools")
    exec(compile(TOOLS_PATH.read_text(encoding="utf-8"), "snakecage/tools.py", "exec"), module.__dict__)
    module.native = native
    return module


def test_call_and_attribute_sugar_send_json_arguments(tools):
    assert tools.call("get_weather", city="Zürich") == {"temp": 21}
    assert tools.get_weather(city="Bern", days=[1, 2]) == {"temp": 21}
    assert tools.native.sent == [
        ("get_weather", {"city": "Zürich"}),
        ("get_weather", {"city": "Bern", "days": [1, 2]}),
    ]
    assert tools.call("team.lookup") == {"temp": 21}


def test_list_search_and_dir(tools):
    assert [t["name"] for t in tools.list()] == ["get_weather", "team.lookup"]
    assert tools.search("weather") == [CATALOG[0]]
    assert "get_weather" in dir(tools) and "team.lookup" not in dir(tools)
    with pytest.raises(TypeError):
        tools.search(3)


@pytest.mark.parametrize(
    ("kind", "cls", "base"),
    [
        ("failed", "ToolError", Exception),
        ("unknown_tool", "UnknownToolError", AttributeError),
        ("invalid_arguments", "ToolArgumentsError", TypeError),
        ("limit", "ToolLimitError", Exception),
        ("timeout", "ToolTimeoutError", TimeoutError),
        ("cancelled", "ToolError", Exception),
    ],
)
def test_errors_raise_the_class_of_their_kind(tools, kind, cls, base):
    tools.native.answer = {"status": "error", "kind": kind, "message": "nope", "data": {"x": 1}}
    with pytest.raises(getattr(tools, cls)) as info:
        tools.get_weather(city="x")
    err = info.value
    assert isinstance(err, tools.ToolError) and isinstance(err, base)
    assert (err.message, err.data, err.tool, err.kind) == ("nope", {"x": 1}, "get_weather", kind)
    assert str(err) == "nope"


def test_unknown_attributes_and_non_json_arguments_raise_before_sending(tools):
    with pytest.raises(tools.UnknownToolError, match="unknown tool 'launch'"):
        tools.launch
    assert not hasattr(tools, "launch")
    with pytest.raises(tools.ToolArgumentsError, match="must be JSON values"):
        tools.get_weather(when=object())
    with pytest.raises(tools.ToolArgumentsError):
        tools.get_weather(x=float("nan"))
    assert tools.native.sent == []
