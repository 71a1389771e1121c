"""Redis storage of messages: key names, Lua scripts and the repository."""

from outbox.store.exchange import ExchangeReply, ExchangeRequest, PartitionAsk
from outbox.store.keys import Keys
from outbox.store.repository import (
    BulkResult,
    Change,
    ChangeResult,
    Claim,
    Created,
    CreateResult,
    MessageRepository,
)

__all__ = [
    "BulkResult",
    "Change",
    "ChangeResult",
    "Claim",
    "CreateResult",
    "Created",
    "ExchangeReply",
    "ExchangeRequest",
    "Keys",
    "MessageRepository",
    "PartitionAsk",
]
