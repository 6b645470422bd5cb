"""The fake in its own process: `python -m spade_async.testing.fake --port P`."""

from __future__ import annotations

import argparse

import uvicorn

from spade_async.testing.fake.app import build_app
from spade_async.testing.fake.state import FakeState


def main() -> None:
    """`python -m spade_async.testing.fake --port P [--token-latency S]`: the fake in its
    own process (benchmarks: an in-process server would share our GIL and skew the ratio)."""
    ap = argparse.ArgumentParser(prog="python -m spade_async.testing.fake", description=main.__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-latency", type=float, default=0.0)
    ap.add_argument("--request-latency", type=float, default=0.0)
    ap.add_argument("--eos", type=int, default=-1, help="token id that ends a turn (-1: none)")
    args = ap.parse_args()
    state = FakeState(token_latency_s=args.token_latency, request_latency_s=args.request_latency,
                      eos_token_id=args.eos)
    state.keep_no_requests()  # a long benchmark must not keep every request body
    uvicorn.run(build_app(state), host="127.0.0.1", port=args.port, log_level="error",
                lifespan="off", access_log=False)


if __name__ == "__main__":
    main()
