"""An upstream MCP server for the Code Mode tests, built on the official MCP Python SDK:
three tools: one adds, one always fails, one waits as long as it is told.

    python mcp_upstream.py                 # stdio
    python mcp_upstream.py http PORT       # streamable HTTP on 127.0.0.1:PORT/mcp
    python mcp_upstream.py https PORT CERT KEY   # the same over HTTPS (PEM files)
"""

import asyncio
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("upstream-fixture")


@server.tool(description="Add two integers and say who added them")
def add(a: int, b: int) -> dict:
    return {"sum": a + b, "by": "upstream-fixture"}


@server.tool(description="Always fails with the given reason")
def explode(reason: str) -> str:
    raise ToolError(f"exploded: {reason}")


@server.tool(description="Wait the given number of seconds, then say so")
async def wait(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif len(sys.argv) > 4 and sys.argv[1] == "https":
        import uvicorn

        uvicorn.run(
            server.streamable_http_app(host="127.0.0.1"),
            host="127.0.0.1",
            port=int(sys.argv[2]),
            ssl_certfile=sys.argv[3],
            ssl_keyfile=sys.argv[4],
            log_level="warning",
        )
    else:
        server.run()
