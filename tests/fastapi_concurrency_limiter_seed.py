"""The usage example of fastapi-concurrency-limiter's README, with its imports pointed at this
package; the handlers block on an event so that a test can saturate the database resource."""

import threading

from fastapi import FastAPI

from fastapi_stream_lease import Limiter, Resource


def build_app() -> tuple[FastAPI, threading.Event, Limiter]:
    release = threading.Event()
    app = FastAPI()

    database_resource = Resource(2)  # max 2 concurrent DB operations
    file_resource = Resource(10)  # max 10 concurrent file operations

    # Register resources with the limiter in the order they should be acquired.
    limiter = Limiter(timeout=0.2, resources=[database_resource, file_resource])

    @app.get("/messages")
    @limiter.resources([database_resource])
    def read_messages():
        release.wait(10)
        return []

    @app.get("/file")
    @limiter.resources([file_resource])
    async def read_file():
        return "file"

    @app.get("/messages-and-file")
    @limiter.resources([database_resource, file_resource])  # registration order
    async def read_messages_and_file():
        return "both"

    @app.get("/file-and-messages")
    @limiter.resources([file_resource, database_resource])  # any order: one atomic step
    async def read_file_and_messages():
        return "both"

    return app, release, limiter
