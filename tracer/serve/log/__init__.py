"""The gateway's conversation log (``tracer serve --log DIR``), a native dataset that ``tracer update`` learns
from.

``exchange`` (what is logged of a chat exchange once its answer has gone out, and when its outcome applies),
``stream_reply`` and ``content_coding`` (the assistant message read back from the bytes that went out: a
streamed answer rebuilt, a compressed one decoded), ``sink`` (:class:`~tracer.serve.log.sink.ConversationLog`:
conversations kept until they end, then written), ``record`` (a conversation brought to the dataset's rules)
and ``files`` (the files on disk, rotated and bounded).
"""
