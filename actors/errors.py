"""Errors raised to callers of an actor."""


class ActorError(Exception):
    """Base class of the runtime's own errors."""


class ActorStopped(ActorError):
    """The actor is not running, or stopped before it replied."""

    def __init__(self, name: str, detail: str = "is not running") -> None:
        super().__init__(f"actor {name!r} {detail}")
        self.actor = name


class AskTimeout(ActorError, TimeoutError):
    """No reply arrived within the ``ask`` timeout."""

    def __init__(self, name: str, message: object, timeout: float) -> None:
        super().__init__(f"actor {name!r} did not reply to {type(message).__name__} within {timeout:g}s")
        self.actor = name
        self.timeout = timeout
