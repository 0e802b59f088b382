"""The result every call ends as: `broker.protocol`'s `ToolResult`, under the name
the documentation gives it (`broker.result.ToolResult`)."""

from __future__ import annotations

from broker.protocol import OutboxFile, ToolResult

__all__ = ["OutboxFile", "ToolResult"]
