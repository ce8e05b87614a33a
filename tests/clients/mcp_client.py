"""Drives snakecage's /mcp endpoint with the official MCP Python SDK, as an agent would,
and prints what it saw as JSON for the Rust integration test to assert on.

Usage: mcp_client.py URL stateless|session|cancel|large|bulky [API_KEY]
       mcp_client.py URL foreign API_KEY SESSION_ID   (runs in a session that is not the key's)
"""

import asyncio
import base64
import json
import logging
import os
import sys
import time

import anyio
import httpx2
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def summary(result):
    blocks = []
    for c in result.content:
        block = {"type": c.type}
        if c.type == "text":
            block["text"] = c.text
        elif c.type == "image":
            raw = base64.b64decode(c.data)
            block["mime_type"] = c.mime_type
            block["png_magic"] = raw[:8] == b"\x89PNG\r\n\x1a\n"
            block["bytes"] = len(raw)
        blocks.append(block)
    return {"is_error": bool(result.is_error), "content": blocks}


class Warnings(logging.Handler):
    """Collects what the SDK logs at WARNING and above (e.g. a failed session close)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


async def stateless(s, out):
    out["hello"] = summary(await s.call_tool("run_python", {"code": "print(6 * 7)"}))
    out["lines"] = summary(await s.call_tool("run_python", {"code": ["x = 6", "print(x * 7)"]}))
    plot = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nprint('plotted')"
    out["plot"] = summary(await s.call_tool("run_python", {"code": plot}))
    out["error"] = summary(await s.call_tool("run_python", {"code": "def f():\n    return 1 / 0\nf()"}))
    out["packages"] = summary(await s.call_tool("list_packages", {}))


async def session(s, out):
    created = await s.call_tool("create_python_session", {})
    out["created"] = summary(created)
    sid = json.loads(created.content[0].text)["session_id"]
    out["set"] = summary(await s.call_tool("run_in_session", {"session_id": sid, "code": "x = 40"}))
    out["get"] = summary(await s.call_tool("run_in_session", {"session_id": sid, "code": "print(x + 2)"}))
    out["closed"] = summary(await s.call_tool("close_python_session", {"session_id": sid}))
    out["after_close"] = summary(await s.call_tool("run_in_session", {"session_id": sid, "code": "print(x)"}))


async def foreign(s, out):
    sid = sys.argv[4]
    out["foreign"] = summary(await s.call_tool("run_in_session", {"session_id": sid, "code": "print(1)"}))
    out["mine"] = summary(await s.call_tool("run_python", {"code": "print(6 * 7)"}))


async def cancel(s, out):
    """Gives up on a long call once it runs (the SDK then sends `notifications/cancelled` and
    keeps the session open), then watches the service's /health until no worker is busy (or
    20 s pass)."""
    code = "import time\ntime.sleep(30)\nprint('finished')"
    health = out["url"].rsplit("/mcp", 1)[0] + "/health"

    async with httpx2.AsyncClient() as http:

        async def busy():
            return (await http.get(health)).json()["pool"]["busy"]

        async def wait_for(predicate):
            deadline = time.monotonic() + 20
            while not predicate(n := await busy()) and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            return n

        async with anyio.create_task_group() as tg:

            async def call():
                await s.call_tool("run_python", {"code": code, "timeout_ms": 40000})
                out["finished"] = True

            tg.start_soon(call)
            out["busy_while_running"] = await wait_for(lambda n: n > 0)
            tg.cancel_scope.cancel()
        out["gave_up"] = "finished" not in out
        out["busy_after_cancel"] = await wait_for(lambda n: n == 0)
    # The session still works after a cancellation.
    out["after"] = summary(await s.call_tool("run_python", {"code": "print('après')"}))


async def large(s, out):
    """A call over 4 MiB but within limits.max_request_bytes, then one over it. The first
    may take seconds on a busy machine (6 MB of source to decode and compile): it gets the
    largest timeout, not the default 2 s."""
    within = "s = '" + "é" * (3 << 20) + "'\nprint(len(s))"
    out["within"] = summary(
        await s.call_tool("run_python", {"code": within, "timeout_ms": 60000})
    )
    over = "s = '" + "x" * (11 << 20) + "'"
    try:
        await s.call_tool("run_python", {"code": over})
        out["over"] = "no error"
    except MCPError as e:
        out["over"] = {"code": e.error.code, "message": e.error.message}


async def bulky(s, out):
    """Results that would not fit one SSE event of the SDK (1 MiB) whole, and what an agent
    needs to read of a run: a timeout's limit, files not stored, a progress bar's last frame."""

    async def call(name, code, timeout_ms=30000):
        try:
            out[name] = summary(await s.call_tool("run_python", {"code": code, "timeout_ms": timeout_ms}))
        except Exception as e:  # what the agent would get instead of a result
            out[name] = {"failed": f"{type(e).__name__}: {e}"}

    # Both streams at limits.max_output_bytes, of control characters (six bytes of JSON each).
    await call("streams", "import sys\nprint('START')\nprint('\\x01' * 2_000_000)\n"
                          "sys.stderr.write('ERRSTART\\n' + '\\x02' * 2_000_000)")
    # A detailed figure (a PNG of over a megabyte), then a small one.
    await call("figures", "import numpy as np, matplotlib.pyplot as plt\n"
                          "rng = np.random.default_rng(0)\nplt.figure(figsize=(10, 10), dpi=100)\n"
                          "plt.scatter(rng.random(40_000), rng.random(40_000), s=1, c=rng.random(40_000))\n"
                          "plt.figure(figsize=(2, 2))\nplt.plot([1, 2, 3])\nprint('plotted')")
    # Drawn fast: far more than limits.max_output_bytes of frames before the answer.
    await call("progress", "import sys\nfor i in range(200_000):\n"
                           "    sys.stdout.write('\\r%3d%%|%s|' % (i // 2000, '#' * (i // 5000)))\n"
                           "print()\nprint('ANSWER = 42')")
    await call("timeout", "import time\ntime.sleep(30)", timeout_ms=300)
    await call("skipped", "import os\nopen('kept.txt', 'w').write('ok')\nos.symlink('/etc/passwd', 'link')")


async def describe(s, out):
    """Only the listing main() already records (the tool descriptions)."""


async def main(url, scenario, key):
    out = {"url": url}
    warnings = Warnings()
    logging.getLogger().addHandler(warnings)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                out["server"] = init.server_info.name
                tools = (await s.list_tools()).tools
                out["tools"] = [t.name for t in tools]
                out["run_python_description"] = next(t.description for t in tools if t.name == "run_python")
                await {"stateless": stateless, "session": session, "foreign": foreign, "describe": describe,
                       "cancel": cancel, "large": large, "bulky": bulky}[scenario](s, out)
    out["warnings"] = warnings.messages
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else os.environ.get("SNAKECAGE_API_KEY")))
