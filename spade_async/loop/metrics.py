"""Prometheus metrics of the daemon, on their own registry (one per daemon; tests build many).
Served over HTTP when `daemon.metrics_port` is set; never required for the loop to run."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.designs = Counter("spade_designs", "designs proposed, by outcome", ["status"],
                               registry=r)
        self.rejections = Counter("spade_rejections", "rejected designs by reason", ["reason"],
                                  registry=r)
        self.episodes = Counter("spade_episodes", "episodes played", ["hinted", "outcome"],
                                registry=r)
        self.tokens = Counter("spade_tokens", "tokens sampled", ["role"], registry=r)
        self.batches = Counter("spade_batches", "batches written to the spool", registry=r)
        self.samples = Counter("spade_samples", "samples written, by role", ["role"], registry=r)
        self.stale = Counter("spade_samples_stale_dropped", "samples older than max_staleness",
                             registry=r)
        self.samples_played = Counter(
            "spade_samples_played", "samples played: agent episodes that ran to their end "
            "(failed or not) and designs the endpoint answered, by role", ["role"], registry=r)
        self.samples_dropped = Counter(
            "spade_samples_dropped", "played samples never written to the spool, by role and "
            "reason (spade_async/loop/ledger.py)", ["role", "reason"], registry=r)
        self.request_tokens = Counter(
            "spade_request_tokens", "tokens of the requests designs and episodes sent, by role "
            "and kind (prompt: prefilled; sampled: decoded)", ["role", "kind"], registry=r)
        self.regret = Histogram("spade_env_regret", "regret per played environment",
                                buckets=(0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0), registry=r)
        self.policy_version = Gauge("spade_policy_version", "newest published policy version",
                                    registry=r)
        self.staleness = Gauge("spade_batch_staleness", "policy versions between the newest and "
                               "the oldest sample of the last batch", registry=r)
        self.in_flight = Gauge("spade_in_flight", "work in flight, by stage", ["stage"],
                               registry=r)
        self.endpoint_in_flight = Gauge("spade_endpoint_in_flight", "requests in flight",
                                        ["endpoint"], registry=r)
        self.endpoint_saturation = Gauge(
            "spade_endpoint_saturation", "mean share of max_concurrency in flight over the run, "
            "by phase (running, or trainer_wait while back-pressure holds new work)",
            ["endpoint", "phase"], registry=r)
        self.failures = Counter("spade_failures", "expected failures of work items, by stage "
                                "and kind (deadline, timeout, connection, http_5xx, ...)",
                                ["stage", "kind"], registry=r)
        self.given_up = Counter("spade_given_up", "work items abandoned after their retry "
                                "budget, by stage", ["stage"], registry=r)
        self.queue_depth = Gauge("spade_env_queue_depth", "accepted envs waiting to be played",
                                 registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
