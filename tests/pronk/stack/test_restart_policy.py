"""The restart policy's backoff, reset and give-up, on timestamps alone."""

from __future__ import annotations

from pronk.stack.restart_policy import RestartHistory, RestartPolicy


def test_delay_doubles_from_the_base_and_stops_at_the_cap():
    policy = RestartPolicy(base_delay_s=1.0, max_delay_s=10.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert policy.delay(10_000) == 10.0


def test_consecutive_failures_back_off_and_give_up_at_the_limit():
    history = RestartHistory(RestartPolicy(base_delay_s=1.0, max_delay_s=60.0, max_failures=4, failure_window_s=100.0))
    assert [history.record_failure(t) for t in (0.0, 1.0, 3.0)] == [1.0, 2.0, 4.0]
    assert history.record_failure(7.0) is None


def test_failures_older_than_the_window_do_not_count_towards_giving_up():
    history = RestartHistory(RestartPolicy(max_failures=3, failure_window_s=10.0, healthy_reset_s=1e9))
    assert history.record_failure(0.0) is not None
    assert history.record_failure(5.0) is not None
    assert history.record_failure(20.0) is not None  # the one at 0 s and 5 s have left the window
    assert history.failures == [20.0]
    assert history.record_failure(21.0) is not None
    assert history.record_failure(22.0) is None


def test_a_stretch_of_healthy_running_resets_the_backoff_but_not_the_restart_count():
    history = RestartHistory(RestartPolicy(base_delay_s=1.0, healthy_reset_s=30.0, max_failures=100))
    for t in range(4):
        history.record_failure(float(t))
    history.restarts = 4
    history.record_healthy(serving_since=10.0, now=20.0)  # not long enough
    assert history.record_failure(21.0) == 16.0
    history.record_healthy(serving_since=40.0, now=70.0)
    assert history.consecutive == 0 and history.restarts == 4
    assert history.record_failure(71.0) == 1.0
