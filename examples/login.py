"""The article's login endpoint: at most 20 attempts a minute per client address, and 5 per
username from one address, counted together in one atomic step, whether or not the user
exists (so the limit tells an attacker nothing about which usernames are real).

Run it:  REDIS_URL=redis://localhost:6379 .venv/bin/uvicorn examples.login:app
(without REDIS_URL it uses the embedded store), then
         curl -X POST localhost:8000/login -d '{"username": "alice", "password": "x"}'
Behind a reverse proxy, name it in TRUSTED_PROXIES (comma-separated) and the header it writes
the client's address into in PROXY_HEADER (X-Forwarded-For unless set), and run uvicorn with
--no-proxy-headers, so that the limit counts the client, not the proxy, and no header a client
writes itself (docs/recipes/client-address.md).
"""

from __future__ import annotations

import hmac
import os

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from fastapi_stream_lease import (
    LeaseConfig,
    RateLimit,
    StreamLeaseManager,
    install_exception_handler,
)

login_ip_per_minute = RateLimit("login_ip_per_minute", 20, per=60)
login_user_ip_per_minute = RateLimit("login_user_ip_per_minute", 5, per=60)

manager = StreamLeaseManager(
    url=os.environ.get("REDIS_URL", "memory://"),
    config=LeaseConfig(
        identity_secret=os.environ.get("IDENTITY_SECRET", "example-secret-not-for-production"),
        trusted_proxies=os.environ.get("TRUSTED_PROXIES", "127.0.0.1").split(","),
        proxy_header=os.environ.get("PROXY_HEADER", "X-Forwarded-For"),
    ),
)
app = FastAPI()
install_exception_handler(app)

USERS = {"alice": "correct horse battery staple"}  # stands in for a user store


class Credentials(BaseModel):
    username: str
    password: str


@app.post("/login")
async def login(credentials: Credentials, request: Request) -> dict[str, str]:
    ip = manager.client_ip(request)
    # Counted before the password is checked, for existing and unknown users alike.
    await manager.hit(
        ip,
        login_ip_per_minute,
        (login_user_ip_per_minute, f"{credentials.username.lower()}|{ip}"),
    )
    expected = USERS.get(credentials.username, "")
    if not (expected and hmac.compare_digest(expected, credentials.password)):
        raise HTTPException(status_code=401, detail="wrong username or password")
    return {"welcome": credentials.username}
