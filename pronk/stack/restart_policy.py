"""When to restart a dead engine worker: exponential backoff, reset by healthy running, and a point to give up.

Pure bookkeeping on timestamps the caller passes in, so it is tested without processes or clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    base_delay_s: float = 1.0
    """Delay before the first restart; each further consecutive failure doubles it."""
    max_delay_s: float = 60.0
    """The doubling stops here."""
    healthy_reset_s: float = 120.0
    """A worker that served this long since its last start has its backoff reset to `base_delay_s`."""
    max_failures: int = 5
    """Give up on a worker after this many failures within `failure_window_s`."""
    failure_window_s: float = 600.0

    def delay(self, consecutive_failures: int) -> float:
        """Seconds to wait before the restart that follows the `consecutive_failures`-th failure in a row (1-based)."""
        exponent = max(consecutive_failures - 1, 0)
        return self.max_delay_s if exponent >= 64 else min(self.base_delay_s * 2**exponent, self.max_delay_s)


@dataclass(slots=True)
class RestartHistory:
    """One worker's failures as the policy sees them."""

    policy: RestartPolicy
    failures: list[float] = field(default_factory=list)
    """When each failure within the window happened (older ones are dropped)."""
    consecutive: int = 0
    """Failures since the worker last served for `healthy_reset_s`."""
    restarts: int = 0
    """Restarts made so far (never reset): what `pronk stack status` shows."""

    def record_failure(self, now: float) -> float | None:
        """Count a failure at `now`; returns the delay before restarting, or None when it is time to give up."""
        window_start = now - self.policy.failure_window_s
        self.failures = [t for t in self.failures if t > window_start] + [now]
        self.consecutive += 1
        if len(self.failures) >= self.policy.max_failures:
            return None
        return self.policy.delay(self.consecutive)

    def record_healthy(self, serving_since: float, now: float) -> None:
        """The worker has served since `serving_since`: long enough, and its backoff starts over."""
        if now - serving_since >= self.policy.healthy_reset_s:
            self.consecutive = 0
