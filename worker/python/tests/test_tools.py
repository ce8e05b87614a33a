"""Tests for worker/python/tools.py (``snakecage.tools``) against a stand-in for its native
half ``_snakecage_tools``, which the real worker implements in Rust (worker/src/tools.rs):
the Python half's job is the API, JSON in and out, and exceptions."""

import asyncio
import json
import subprocess
import sys
import threading
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
        self.cap = 3
        # When set, every call waits at it: calls that are not in flight together fail it.
        self.barrier = None
        self.threads = set()
        # When set, every acall is held until its task stops waiting for it.
        self.hold = False
        self.tickets = []
        self.threads_fail = False

    def max_concurrent_calls(self):
        return self.cap

    def catalog(self):
        return json.dumps(CATALOG)

    def search(self, query, limit):
        return json.dumps([t for t in CATALOG if query in t["name"]][:limit])

    def call(self, name, arguments):
        if name not in {t["name"] for t in CATALOG}:
            return json.dumps({"status": "error", "kind": "unknown_tool", "message": f"unknown tool '{name}'"})
        self.sent.append((name, json.loads(arguments)))
        self.threads.add(threading.current_thread())
        if self.barrier is not None:
            self.barrier.wait()
        answer = self.answer
        if answer.get("echo"):
            answer = {"status": "ok", "result": json.loads(arguments)}
        return json.dumps(answer)

    def prepare(self, name, arguments):
        if name not in {t["name"] for t in CATALOG}:
            return self.call(name, arguments)
        ticket = FakeTicket(self, name, arguments)
        self.tickets.append(ticket)
        return ticket

    def start_thread(self, target, name):
        if self.threads_fail:
            raise RuntimeError("can't start new thread")
        started = threading.Event()
        threading.Thread(target=target, args=(started.set,), name=name, daemon=True).start()
        started.wait()


class FakeTicket:
    """A call prepared for ``acall``: made on a pool thread, cancelled from the loop. A held
    call waits until it is cancelled (as the host answers a cancelled call) or released."""

    def __init__(self, native, name, arguments):
        self.native, self.name, self.arguments = native, name, arguments
        self.done = threading.Event()
        self.cancelled = False

    def wait(self):
        if self.native.hold:
            self.native.sent.append((self.name, json.loads(self.arguments)))
            self.done.wait(30)
            assert self.cancelled, "held past the test"
            return json.dumps({"status": "error", "kind": "cancelled", "message": "stopped"})
        return self.native.call(self.name, self.arguments)

    def cancel(self):
        self.cancelled = True
        self.done.set()


@pytest.fixture()
def tools(monkeypatch):
    native = FakeNative()
    fake = types.ModuleType("_snakecage_tools")
    for attr in ("catalog", "search", "call", "max_concurrent_calls", "prepare", "start_thread"):
        setattr(fake, attr, getattr(native, attr))
    fake.MAX_JSON_DEPTH = 64
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


def test_arguments_too_deep_to_encode_raise_a_limit_error_before_sending(tools):
    deep = 0
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(tools.ToolLimitError) as info:
        tools.get_weather(city=deep)
    assert info.value.kind == "limit" and info.value.tool == "get_weather"
    assert "nested too deep to be encoded, deeper than the 64 levels" in info.value.message
    with pytest.raises(tools.ToolLimitError, match="the 64 levels"):
        asyncio.run(tools.aio.get_weather(city=deep))
    assert tools.native.sent == []
    assert tools.MAX_JSON_DEPTH == 64


def test_acall_and_aio_run_calls_together_on_the_pool_sized_to_the_cap(tools):
    tools.native.answer = {"echo": True}
    # Three calls that each wait for the other two: they pass only if in flight together.
    tools.native.barrier = threading.Barrier(3, timeout=30)

    async def main():
        return await asyncio.gather(
            tools.acall("get_weather", city="Zürich"),
            tools.aio.get_weather(city="東京"),
            tools.acall("team.lookup", n=3),
        )

    assert asyncio.run(main()) == [{"city": "Zürich"}, {"city": "東京"}, {"n": 3}]
    # On three threads of the pool, daemon ones: a one-shot run does not wait for them.
    pool = tools.native.threads
    assert len(pool) == 3 and all(t.daemon for t in pool), pool
    assert {t.name for t in pool} == {"snakecage-tools-1", "snakecage-tools-2", "snakecage-tools-3"}
    # Idle threads take the next calls; the pool never grows past the cap.
    tools.native.barrier = None
    tools.native.threads = set()

    async def more():
        return await asyncio.gather(*(tools.acall("get_weather", i=i) for i in range(7)))

    assert asyncio.run(more()) == [{"i": i} for i in range(7)]
    assert tools.native.threads <= pool
    assert tools._pool_threads == 3


def test_async_errors_raise_the_same_classes_as_call(tools):
    tools.native.answer = {"status": "error", "kind": "timeout", "message": "late", "data": None}

    async def main():
        with pytest.raises(tools.ToolTimeoutError, match="late") as info:
            await tools.aio.get_weather(city="x")
        assert info.value.tool == "get_weather" and isinstance(info.value, TimeoutError)
        with pytest.raises(tools.ToolError, match="late"):
            await tools.acall("team.lookup")
        with pytest.raises(tools.UnknownToolError, match="unknown tool 'launch'"):
            tools.aio.launch
        with pytest.raises(tools.ToolArgumentsError, match="must be JSON values"):
            await tools.acall("get_weather", when=object())
        with pytest.raises(TypeError):
            await tools.acall(3)

    asyncio.run(main())
    assert tools.native.sent == [("get_weather", {"city": "x"}), ("team.lookup", {})]
    assert "get_weather" in dir(tools.aio) and "team.lookup" not in dir(tools.aio)
    assert {"acall", "aio"} <= set(dir(tools))


def test_loading_the_module_imports_neither_asyncio_nor_concurrent_futures():
    # In a fresh interpreter: the module is loaded in every zygote, the lightest included.
    script = f"""
import sys, types, json
fake = types.ModuleType("_snakecage_tools")
fake.catalog = lambda: "[]"
fake.MAX_JSON_DEPTH = 64
sys.modules["_snakecage_tools"] = fake
module = types.ModuleType("snakecage.tools")
exec(compile(open({str(TOOLS_PATH)!r}, encoding="utf-8").read(), "tools.py", "exec"), module.__dict__)
print(json.dumps(sorted(m for m in ("asyncio", "concurrent.futures", "threading") if m in sys.modules)))
"""
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_a_task_that_stops_waiting_cancels_its_call(tools):
    # wait_for, asyncio.timeout and a TaskGroup: each cancels the ticket it awaits, which
    # (as the host's answer to the cancel does) frees the pool thread for the next call.
    tools.native.cap = 1
    tools.native.hold = True

    async def main():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(tools.aio.get_weather(city="wait_for"), 0.05)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await tools.acall("get_weather", city="timeout")

        async def stop():
            while len(tools.native.sent) < 3:
                await asyncio.sleep(0.01)
            raise ValueError("stop")

        with pytest.raises(ExceptionGroup):
            async with asyncio.TaskGroup() as group:
                group.create_task(tools.aio.get_weather(city="group"))
                group.create_task(stop())
        tools.native.hold = False
        return await tools.acall("get_weather", city="after")

    assert asyncio.run(main()) == {"temp": 21}
    assert [t.cancelled for t in tools.native.tickets] == [True, True, True, False]
    assert [a["city"] for _, a in tools.native.sent] == ["wait_for", "timeout", "group", "after"]
    # One thread (the cap) served them all: each cancel freed it.
    assert tools._pool_threads == 1


def test_a_thread_that_cannot_start_is_a_limit_error_and_nothing_is_sent(tools):
    tools.native.threads_fail = True

    async def main():
        with pytest.raises(tools.ToolLimitError, match="no thread could be started") as info:
            await tools.aio.get_weather(city="x")
        assert (info.value.kind, info.value.tool) == ("limit", "get_weather")
        # Refused by the native half: no thread is needed.
        with pytest.raises(tools.UnknownToolError):
            await tools.acall("launch")

    asyncio.run(main())
    assert tools.native.sent == []
    assert tools._pool_threads == 0
    # Once threads start again, calls go out.
    tools.native.threads_fail = False
    assert asyncio.run(tools.acall("get_weather", city="y")) == {"temp": 21}
