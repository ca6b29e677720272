"""farm's OpenAI streaming load client: ``client`` (``OpenAIClient``), ``load_loop`` (the asyncio loop in a process
of its own), ``http_stream`` (HTTP/1.1 on an asyncio Protocol), ``stream`` (one streamed completion), ``workload``
(prompts and lengths), ``server_metrics`` (the server's Prometheus view), ``saturation`` (the over-saturation rule)."""
