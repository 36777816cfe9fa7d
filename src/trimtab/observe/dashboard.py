"""The live dashboard and ``/metrics``, served by the coordinator's process on
127.0.0.1 (Starlette on uvicorn, in a thread of its own). Everything it shows comes
from the event stream:

- ``/``: the page (``static/index.html``, charts by the vendored uPlot: no CDN, it
  works offline);
- ``/api/stream?since=N``: the events after ``N`` as server-sent events;
- ``/api/events?since=N``: the same as JSON, for a browser without server-sent events
  (the page falls back to polling it);
- ``/metrics``: Prometheus' text format (:mod:`.metrics`).

Needs ``starlette`` and ``uvicorn`` (``pip install 'trimtab[observe]'``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from anyio import to_thread
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from trimtab.observe.metrics import Metrics
from trimtab.roles.coordinator.events import Events

log = logging.getLogger("trimtab.observe")

STATIC = Path(__file__).parent / "static"

#: Events sent in one batch of the stream (a page opened late catches up in batches).
BATCH = 2000

#: A stream sends at most this often once caught up (a page redraws twice a second; a
#: message per event would wake the coordinator's process for each step report).
SEND_EVERY_S = 0.25


def app(events: Events, metrics: Metrics, stopping: threading.Event) -> Starlette:
    """The dashboard's web application over ``events`` and ``metrics``; its streams end
    once ``stopping`` is set."""

    async def index(_: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def scrape(_: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def since_of(request: Request) -> int:
        """``?since=N``, or a reconnecting EventSource's ``Last-Event-ID`` if later."""
        try:
            since = int(request.query_params.get("since", "0"))
            return max(0, since, int(request.headers.get("last-event-id", "0")))
        except ValueError:
            return 0

    async def poll(request: Request) -> Response:
        batch = events.since(since_of(request), BATCH)
        return JSONResponse({"seq": events.seq, "events": batch})

    async def stream(request: Request) -> Response:
        seq = since_of(request)

        async def body() -> AsyncIterator[str]:
            nonlocal seq
            yield "retry: 2000\n\n"
            while True:
                batch = events.since(seq, BATCH)
                if batch:
                    seq = batch[-1]["seq"]
                    yield f"id: {seq}\ndata: {json.dumps(batch, default=str)}\n\n"
                    if len(batch) == BATCH:
                        continue  # catching up
                if stopping.is_set():
                    return  # (after the last events: the job's end among them)
                if batch:  # caught up: gather the next ones a while
                    await asyncio.sleep(SEND_EVERY_S)
                    continue
                if await request.is_disconnected():
                    return
                got = await to_thread.run_sync(events.wait, seq, 0.5)
                if not got:
                    yield ": idle\n\n"  # a comment: finds a closed connection

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/metrics", scrape),
            Route("/api/events", poll),
            Route("/api/stream", stream),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )


class Dashboard:
    """The dashboard's web server on ``sock`` (bound by :func:`trimtab.observe.live.bind`),
    serving in a daemon thread until :meth:`close`. Never blocks."""

    def __init__(self, events: Events, metrics: Metrics, sock: socket.socket) -> None:
        self._stopping = threading.Event()
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]
        config = uvicorn.Config(
            app(events, metrics, self._stopping),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="trimtab-dashboard", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Where a browser finds the page."""
        return f"http://{self.host}:{self.port}/"

    def _serve(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except Exception:
            log.exception("the dashboard stopped")

    def close(self) -> None:
        """Stop serving (open streams end within a second). Blocks up to 5 s."""
        self._stopping.set()
        self._server.should_exit = True
        self._thread.join(5)
        self._sock.close()
