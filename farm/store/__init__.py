"""The model store: bytes beside the database (``farm.store.base``), and each worker's cache of them."""
