"""Drives snakecage's /mcp endpoint with the official MCP Python SDK, as an agent would,
and prints what it saw as JSON for the Rust integration test to assert on.

Usage: mcp_client.py URL stateless|session [API_KEY]
       mcp_client.py URL foreign API_KEY SESSION_ID   (runs in a session that is not the key's)
"""

import asyncio
import base64
import json
import logging
import os
import sys

from mcp import ClientSession
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


async def describe(s, out):
    """Only the listing main() already records (the tool descriptions)."""


async def main(url, scenario, key):
    out = {}
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
                await {"stateless": stateless, "session": session, "foreign": foreign, "describe": describe}[scenario](s, out)
    out["warnings"] = warnings.messages
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else os.environ.get("SNAKECAGE_API_KEY")))
