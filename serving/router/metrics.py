"""Prometheus metrics for the router, hand-rolled: a dict increment per event, text rendered on scrape.

Labels are bounded: route, revision (short fingerprint), arm and outcome. Never per-request values.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

Labels = tuple[tuple[str, str], ...]


class Histogram:
    """Cumulative-bucket histogram per label set."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = defaultdict(float)

    def observe(self, labels: Labels, value: float) -> None:
        """Count ``value`` in its bucket (the +Inf bucket is the last slot)."""
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.buckets) + 1)
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sums[labels] += value

    def render(self) -> list[str]:
        """Prometheus text lines for this histogram."""
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        for labels, counts in self.counts.items():
            running = 0
            for bound, count in zip((*self.buckets, float("inf")), counts, strict=True):
                running += count
                edge = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f"{self.name}_bucket{_labels((*labels, ('le', edge)))} {running}")
            lines.append(f"{self.name}_sum{_labels(labels)} {self.sums[labels]}")
            lines.append(f"{self.name}_count{_labels(labels)} {running}")
        return lines


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class RouterMetrics:
    """Every metric the router exports."""

    def __init__(self) -> None:
        self.requests: dict[Labels, int] = defaultdict(int)
        self.in_flight: dict[Labels, int] = defaultdict(int)
        self.events: dict[Labels, int] = defaultdict(int)  # shadow and snapshot counters, by kind
        self.generation: dict[Labels, int] = {}
        self.process: dict[str, int] = {}  # gauges of the process, set at scrape: tasks, connections
        self.ttft = Histogram("revgate_router_ttft_seconds", "Arrival to first response byte.", LATENCY_BUCKETS_S)
        self.tpot = Histogram("revgate_router_tpot_seconds", "Time per output token after the first.", TPOT_BUCKETS_S)
        self.e2e = Histogram("revgate_router_e2e_seconds", "Arrival to the last response byte.", LATENCY_BUCKETS_S)

    def count_event(self, name: str, route: str) -> None:
        """Increment ``revgate_router_<name>_total`` for a route."""
        self.events[(("event", name), ("route", route))] += 1

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        lines = _counter("revgate_router_requests_total", "Proxied request attempts.", self.requests)
        lines += _gauge("revgate_router_in_flight", "Requests in flight.", self.in_flight)
        lines += _gauge("revgate_router_route_generation", "Route generation being served.", self.generation)
        for (event, route), count in sorted(self.events.items()):
            name = f"revgate_router_{event[1]}_total"
            lines += [f"# TYPE {name} counter", f"{name}{_labels((route,))} {count}"]
        for name, value in sorted(self.process.items()):
            lines += [f"# TYPE revgate_router_{name} gauge", f"revgate_router_{name} {value}"]
        for histogram in (self.ttft, self.tpot, self.e2e):
            lines += histogram.render()
        return ("\n".join(lines) + "\n").encode()


def _counter(name: str, help_text: str, values: dict[Labels, int]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    return lines + [f"{name}{_labels(labels)} {value}" for labels, value in values.items()]


def _gauge(name: str, help_text: str, values: dict[Labels, int]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    return lines + [f"{name}{_labels(labels)} {value}" for labels, value in values.items()]
