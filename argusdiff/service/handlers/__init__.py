"""The REST app's handlers, one module per group of endpoints; :func:`argusdiff.service.api.create_app`
assembles their routes. Each module's ``routes(api)`` takes the shared dependencies explicitly, as
one :class:`~argusdiff.service.handlers.base.Api`:

- :mod:`.base`: the shared dependencies, authentication, body reading, the error wrapper every
  endpoint goes through, and the server-sent-events response;
- :mod:`.work`: submitting a generation, waiting for it, cancelling it, and the errors of its results;
- :mod:`.results`: response bodies and the result endpoints (``GET /v1/argusdiff/generations/{id}``,
  ``GET /v1/images/{image_id}``);
- :mod:`.streaming`: one streamed generation's events;
- :mod:`.generations`: ``POST /v1/images/generations`` (OpenAI) and ``POST /v1/argusdiff/generations``;
- :mod:`.status`: ``/v1/models``, ``/v1/plan``, ``/v1/cluster`` (authenticated);
- :mod:`.health`: ``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json`` (open).
"""
