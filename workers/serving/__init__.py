"""The serving layer: how each engine's server is launched (``base.Launch``) or attached, declared once per
engine family (``builtin``: farm's own KServe v2 server; ``triton``; ``endpoint``) and found by engine name
in ``registry``. Runners (``workers.runners``) place launches and never name an engine.

Adding an engine: one module here (a ``ServingEngine``) and its card in ``schemas.engines.CARDS`` naming it
(``registry.SERVING`` is built from the cards); an in-process engine instead adds a backend module
(``workers.engines``) named by its card, and the built-in server serves it (docs/architecture.md)."""
