"""The fake OpenAI-compatible server as one ASGI app: the route families composed (chat-only, as a
hosted API stand-in, or vLLM's full set with its `/openapi.json` listing), behind a middleware
that logs every request and enforces the API key and the injected rate limits."""

from __future__ import annotations

import time

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spade_async.testing.fake.admin import admin_routes, models_route
from spade_async.testing.fake.generate import chat_route, completions_route
from spade_async.testing.fake.nccl import nccl_routes
from spade_async.testing.fake.state import FakeState


def build_app(state: FakeState) -> Starlette:
    if state.chat_only:
        return Starlette(routes=[chat_route(state), models_route(state)],
                         middleware=[Middleware(_RequestLog, state=state)])

    async def openapi(request: Request) -> Response:  # FastAPI's listing, as vLLM serves it
        return JSONResponse({"openapi": "3.1.0", "paths": {
            r.path: {m.lower(): {} for m in (r.methods or ()) if m != "HEAD"}
            for r in app.routes if isinstance(r, Route)}})

    app = Starlette(
        routes=[
            Route("/openapi.json", openapi, methods=["GET"]),
            chat_route(state),
            completions_route(state),
            models_route(state),
            *admin_routes(state),
            *nccl_routes(state),
        ],
        middleware=[Middleware(_RequestLog, state=state)],
    )
    return app


class _RequestLog:
    """ASGI middleware: appends "METHOD /path[?query]" of every HTTP request to the state, then
    answers 401 without the state's API key and 429 to the next `rate_limit_next` POSTs."""

    def __init__(self, app, state: FakeState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            query = scope.get("query_string", b"").decode()
            self.state.request_log.append(
                f"{scope['method']} {scope['path']}" + (f"?{query}" if query else ""))
            state = self.state
            if state.api_key is not None:
                headers = dict(scope.get("headers") or ())
                if headers.get(b"authorization", b"").decode() != f"Bearer {state.api_key}":
                    await JSONResponse({"error": {"message": "Incorrect API key provided."}},
                                       401)(scope, receive, send)
                    return
            probe = dict(scope.get("headers") or ()).get(b"x-spade-probe") is not None
            if state.rate_limit_next > 0 and scope["method"] == "POST" and not probe:
                state.rate_limit_next -= 1
                state.rate_limited.append(time.monotonic())
                extra = {"Retry-After": state.retry_after} if state.retry_after else None
                await JSONResponse({"error": {"message": "Rate limit reached"}}, 429,
                                   headers=extra)(scope, receive, send)
                return
        await self.app(scope, receive, send)
