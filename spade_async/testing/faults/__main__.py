"""The fault proxy from a shell: `python -m spade_async.testing.faults --upstream URL --port P
[--fault KIND[:ARG] ...]`, printing one line per request it handled."""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Sequence

from spade_async.testing.faults.plan import ALL_PATHS, SPARED_PATHS, Fault
from spade_async.testing.faults.proxy import FaultProxy


def _parse_fault(spec: str, count: int | None, duration: float | None,
                 paths: tuple[str, ...] | None) -> Fault:
    kind, _, arg = spec.partition(":")
    kind = "down" if kind == "die" else kind
    if kind == "status":
        return Fault("status", count=count, duration=duration, status=int(arg or 500),
                     paths=paths)
    if kind == "stall":
        return Fault("stall", count=count, duration=duration,
                     seconds=float(arg) if arg else None, paths=paths)
    if kind == "down":
        return Fault("down", duration=float(arg) if arg else duration)
    if arg:
        raise ValueError(f"{kind} takes no argument")
    return Fault(kind, count=count, duration=duration, paths=paths)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m spade_async.testing.faults --upstream URL --port P [--fault KIND[:ARG] ...]`:
    the proxy from a shell, one line per request. KIND[:ARG]: stall[:SECONDS], drop,
    status[:CODE], truncate, garbage, down[:SECONDS] (alias die). Faults apply in the order
    given, each to --count requests (default: every request, so only the first applies)."""
    ap = argparse.ArgumentParser(prog="python -m spade_async.testing.faults", description=main.__doc__)
    ap.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8000")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--fault", action="append", default=[], metavar="KIND[:ARG]")
    ap.add_argument("--count", type=int, default=None, help="requests each fault applies to")
    ap.add_argument("--duration", type=float, default=None, help="seconds each fault stays armed")
    ap.add_argument("--all-paths", action="store_true",
                    help=f"faults hit {', '.join(SPARED_PATHS)} too")
    args = ap.parse_args(argv)
    paths = ALL_PATHS if args.all_paths else None
    try:
        faults = [_parse_fault(s, args.count, args.duration, paths) for s in args.fault]
    except ValueError as exc:
        ap.error(str(exc))
    # Ctrl-C stops it even when started with SIGINT ignored (a background job of a
    # non-interactive shell inherits SIG_IGN, and Python then installs no handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with FaultProxy(args.upstream, args.port) as proxy:
        print(f"fault proxy on {proxy.base_url} -> {proxy.upstream}", flush=True)
        for fault in faults:
            proxy.inject(fault)
        shown = 0
        try:
            while True:
                time.sleep(0.1)
                records = proxy.log
                for rec in records[shown:]:
                    status = "-" if rec.status is None else str(rec.status)
                    print(f"{rec.t:9.3f}s {rec.outcome:>14} {status:>4} {rec.path}", flush=True)
                shown = len(records)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
