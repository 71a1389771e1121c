"""Redis storage of messages: key names, Lua scripts and the repository."""

from .keys import Keys
from .repository import Change, ChangeResult, MessageRepository

__all__ = ["Change", "ChangeResult", "Keys", "MessageRepository"]
