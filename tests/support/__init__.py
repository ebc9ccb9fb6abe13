"""What the tests share: free loopback ports, real redis-server processes (one server, a cluster,
a sentinel, TLS), a uvicorn subprocess, and waiting on conditions.

Every module but ``uvicorn_server`` (httpx) uses the standard library only, and this package
imports none of them by itself.
"""
