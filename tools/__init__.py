"""The measuring tools: load test, benchmark, the load generator and checker (the fault campaign's too),
probe, and the ``loadtest.sink`` handler."""
