"""``tracer serve``: the OpenAI-compatible tool-filtering gateway, a Starlette app behind uvicorn.

``gateway`` (the app: one chat request in, the best k tools forwarded), ``validation`` and ``guards`` (what
is refused at the edge), ``offload`` (the selection stage, on the event loop or off it), ``held`` (the
index's registry when clients send no schemas), ``upstream`` (the client to the upstream), ``admin`` (the
``/v1/tracer/`` endpoints), ``metrics`` and ``status`` (Prometheus and JSON logs), ``deadline`` (a read
deadline uvicorn lacks). The log it writes is :mod:`tracer.serve.log`. See docs/gateway.md.
"""
