"""Log records that say which node and stream they are about.

A process may run several clients (nodes), each with many streams; a bare "upload attempt 3
failed" does not say whose. The client and its storage pipeline log through a `ContextLogger`,
which puts ``node_id`` and ``stream_id`` (None when no single stream is concerned) into every
record's attributes, for formatters (``%(node_id)s``) and structured handlers alike.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["ContextLogger"]


class ContextLogger(logging.LoggerAdapter[logging.Logger]):
    """`logger` with ``extra={"node_id": node_id, "stream_id": stream_id}`` on every record.

    A call's own ``extra`` is merged over these (the stdlib adapter would drop it).
    """

    def __init__(self, logger: logging.Logger, node_id: str, stream_id: int | None = None) -> None:
        super().__init__(logger, {"node_id": node_id, "stream_id": stream_id})
        self.node_id = node_id

    def for_stream(self, stream_id: int) -> ContextLogger:
        """The same logger, about stream `stream_id`."""
        return ContextLogger(self.logger, self.node_id, stream_id)

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        own = kwargs.get("extra")
        kwargs["extra"] = {**(self.extra or {}), **(own or {})}
        return msg, kwargs
