"""nats-py's JetStream context, with the errors of asynchronous publishes given to their futures.

nats-py 2.16 (nats-io/nats.py#985, open; fix proposed in #994): a JetStream error reply to
``publish_async`` (a message larger than the stream's ``max_msg_size``, a stream full under
``discard: new``) reaches ``_handle_async_reply``, whose ``APIError.from_error`` raises instead of
returning the error, so the error leaves the subscription's callback (logged as "nats:
encountered error") and the publish's future is never resolved. The sink saw a timeout and
retried the batch for ever, never told why. Here the error is set on that future, as the
library means to; once the library does it itself, nothing is left for this to catch.
"""

from __future__ import annotations

from typing import Any

from nats.js import JetStreamContext
from nats.js import errors as jserr


class JetStream(JetStreamContext):
    """``nc.jetstream()``, with publish_async's error replies raised on their futures."""

    async def _handle_async_reply(self, msg: Any) -> None:
        try:
            await super()._handle_async_reply(msg)
        except jserr.APIError as exc:
            # the token as the library reads it: the reply subject after the inbox and its 22-char id
            token = msg.subject[len(self._nc._inbox_prefix) + 22 + 2 :]
            future = self._publish_async_futures.get(token)
            if future is not None and not future.done():
                future.set_exception(exc)
