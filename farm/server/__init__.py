"""farm's API server (``farm server``): an HTTP API and a web view in front of the database and the broker, so
that a submitter's machine holds no database or broker credential (docs/cluster.md "A shared farm").

A top layer like ``farm.cli``: it may import ``scheduler`` and ``workers``; farm's core never imports it.
``app`` builds the FastAPI application; ``api`` the JSON routes (``/api/v1``), ``web`` the pages, ``uploads``
the streamed uploads, ``access`` who may see what, ``serialize`` the one JSON form of what the readers return.
"""
