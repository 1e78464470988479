"""--max-time is the wall-clock a person waits: the budget arithmetic of attnlab.train.clock
(hand-computed numbers; the trainer's use of it: tests/test_train.py::test_time_budget_*)."""

from __future__ import annotations

import logging
import time

import pytest

from attnlab.train.clock import Budget, count_from, session_start


def test_fraction_leaves_room_for_one_step_and_the_final_validation():
    b = Budget(10.0, warn=False)
    # before any validation was timed: a guessed reserve of min(0.5 s, 10 % of the budget)
    assert b.fraction(4.0) == pytest.approx(4.0 / 9.5)
    b.record_step(1.0)  # the next step is counted before it is taken
    assert b.fraction(4.0) == pytest.approx(5.0 / 9.5)
    b.record_final(2.0)  # what the last validation + checkpoint took
    assert b.fraction(4.0) == pytest.approx(5.0 / 8.0)
    assert b.fraction(7.0) == pytest.approx(1.0)  # 7 s + 1 step + 2 s reserve = the budget: stop
    b.record_step(3.0)  # a running mean: 0.8 * 1 + 0.2 * 3
    assert b.step_time == pytest.approx(1.4)


def test_slow_validation_is_capped_at_half_the_budget_with_a_warning(caplog):
    b = Budget(10.0)
    with caplog.at_level(logging.WARNING, logger="attnlab.train.clock"):
        b.record_final(8.0)
        b.record_final(9.0)  # warned once only
    assert b.fraction(2.0) == pytest.approx(2.0 / 5.0)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "--eval-batches" in warnings[0]


def test_the_clock_starts_when_the_command_starts():
    t0 = time.perf_counter() - 5.0  # the command started 5 s ago (imports, data)
    count_from(t0)
    assert session_start() == t0
    later = session_start()  # taken once: the next training session starts now
    assert later > t0 + 4.0
    count_from(None)
