"""A fault-injection HTTP proxy that tests put between a client and an OpenAI-compatible server.

`proxy.FaultProxy(upstream)` listens on 127.0.0.1 and relays HTTP/1.1 requests to a real vLLM
server or the in-process fake (`spade_async.testing.fake`) until a test asks it to misbehave:
hold a request (stall), hang up without answering (drop), answer an error status, cut a body
short (truncate), answer 200 with a body that is not JSON (garbage), or stop listening
altogether (down). The modules: `plan` (what a fault is), `table` (the armed faults and the
counters), `wire` (HTTP/1.1 bytes), `relay` (one request: its fault or the upstream's answer),
`proxy` (the listener, its thread and schedules), `__main__` (the proxy from a shell).

It is a test harness and must never be used by the daemon, imported by production code, or put
in front of an endpoint that serves real work: it reads every request and may throw any of them
away.
"""
