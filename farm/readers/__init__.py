"""The readers: everything that reads results back out of the database and presents them: ``results`` (the one
row reader), ``report`` (+ ``report_html``, ``report_plots``, ``report_llm_plots``, ``report_ops``), ``compare``,
``export``, ``knee``."""
