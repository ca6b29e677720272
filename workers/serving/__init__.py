"""The serving layer: how each engine's server is launched (``base.Launch``) or attached, declared once per
engine family (``builtin``: farm's own KServe v2 server; ``triton``; ``endpoint``) and found by engine name
in ``registry``. Runners (``workers.runners``) place launches and never name an engine.

Adding an engine: one module here (a ``ServingEngine``), one entry in ``registry.SERVING``, and its rule in
``schemas.engines.RULES``; an in-process engine instead adds a backend (``workers.engines``) and its entry in
``workers.engines.backends.BACKENDS``, and the built-in server serves it."""
