"""An upstream MCP server (stdio) for the depth tests, on the official MCP Python SDK: two
tools: ``nest``, whose structured result nests a list ``levels`` deep, and ``nest_text``,
whose text is such a list as JSON (no structured content)."""

import json

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

server = MCPServer("deep-fixture")


def nested(levels):
    value = 0
    for _ in range(levels):
        value = [value]
    return value


@server.tool(description="A result whose `v` nests a list `levels` deep")
def nest(levels: int) -> CallToolResult:
    value = {"v": nested(levels)}
    text = json.dumps(value)
    return CallToolResult(content=[TextContent(type="text", text=text)], structuredContent=value)


@server.tool(description="Text that is a list nested `levels` deep, as JSON")
def nest_text(levels: int) -> CallToolResult:
    text = "[" * levels + "0" + "]" * levels
    return CallToolResult(content=[TextContent(type="text", text=text)])


if __name__ == "__main__":
    server.run()
