"""The box as an MCP server: ``/mcp`` speaks the Model Context Protocol (Streamable HTTP, JSON
answers) to agents and automation tools, with the API's tokens and the API's access rules.

``server`` is the transport (JSON-RPC over POST); ``tools`` is what a client may call, each tool
one service call presented as the API presents it (docs/reference/mcp.md).
"""
