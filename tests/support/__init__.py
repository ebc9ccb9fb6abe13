"""What the tests and the benchmarks share: free loopback ports, real redis-server processes (one
server, a cluster, a sentinel, TLS), a uvicorn subprocess, the programs under tests/apps/,
waiting on conditions, and URL redaction.

The benchmarks import it too (``benchmarks/common.py`` puts ``tests/`` on the path), from
virtualenvs without the test tools: every module but ``uvicorn_server`` (httpx) uses the
standard library only, and this package imports none of them by itself.
"""
