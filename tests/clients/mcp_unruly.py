"""An upstream MCP server that strains its client, built on the official MCP Python SDK:
results as large as asked, a tool that waits, and one that writes outside the protocol
(lines on stderr, junk on stdout).

    python mcp_unruly.py                 # stdio
    python mcp_unruly.py http PORT       # streamable HTTP on 127.0.0.1:PORT/mcp
    python mcp_unruly.py http-json PORT  # the same, answering with JSON bodies, not SSE
"""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("unruly-fixture")

# The protocol's stdout: the SDK points fd 1 at stderr while it serves (so that a print
# cannot break the framing), and this copy is how junk still gets onto the wire.
WIRE = os.dup(1)


@server.tool(description="Say the given text back")
def echo(s: str) -> str:
    return s


@server.tool(description="A text of the given number of bytes")
def big(n: int) -> str:
    return "b" * n


@server.tool(description="Wait the given number of seconds, then say so")
async def wait(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


@server.tool(description="Write to stderr, and junk to stdout between messages")
def chatter() -> str:
    os.write(2, b"chatter on stderr\n" + b"\x1b[31m" + b"e" * 5000 + b"\n")
    os.write(WIRE, b"this is not json-rpc\n\xff\xfe\n")
    return "said"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in ("http", "http-json"):
        server.run(
            "streamable-http",
            host="127.0.0.1",
            port=int(sys.argv[2]),
            json_response=sys.argv[1] == "http-json",
        )
    else:
        server.run()
