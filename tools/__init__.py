"""The measuring tools: load test, benchmark, their checker and probe, and the ``loadtest.sink`` handler."""
