"""The ordering scenarios' reading of the receiver's log (:func:`tests.faults.ordering_scenarios.examine`):
each violation it must catch, on hand-made logs (no Redis, no processes).

A log row is ``[arrived, decided, id, key, sequence, previous, answer]`` (numbers of the
receiver's one counter; headers as strings, as the receiver reads them).
"""

from __future__ import annotations

from tests.faults.ordering_scenarios import examine

KEYS = {"k": [("a", 1), ("b", 2), ("c", 3)]}


def row(arrived, decided, message_id, seq, prev, answer=200, key="k"):
    return [arrived, decided, message_id, key, str(seq), None if prev is None else str(prev), answer]


def test_a_key_delivered_one_at_a_time_in_order_passes_with_retries_and_a_repeat():
    log = [
        row(1, 2, "a", 1, None, 500),
        row(3, 4, "a", 1, None),
        row(5, 6, "a", 1, None),  # at least once: the head again after a crash
        row(7, 8, "b", 2, 1, "reset"),
        row(9, 10, "b", 2, 1),
        row(11, 12, "c", 3, 2),
    ]
    found = examine(log, KEYS)
    assert (found.inversions, found.ahead, found.overlaps, found.headers, found.never_accepted) == (
        [],
        [],
        [],
        [],
        [],
    )
    assert found.max_in_flight == 1 and found.order == {"k": [1, 2, 3]}
    assert (found.accepted_again, found.repeats) == (1, 1)


def test_a_message_first_accepted_before_an_earlier_one_is_an_inversion():
    log = [row(1, 2, "b", 2, 1), row(3, 4, "a", 1, None), row(5, 6, "c", 3, 2)]
    found = examine(log, KEYS)
    assert found.inversions == ["k#2 first accepted before #1"]
    assert found.order == {"k": [2, 1, 3]}
    assert found.ahead  # b was attempted before a was released


def test_two_requests_of_a_key_in_flight_at_once_are_an_overlap():
    # c arrives (5) before b's answer is decided (6): two of the key in flight
    log = [row(1, 2, "a", 1, None), row(3, 6, "b", 2, 1), row(5, 7, "c", 3, 2)]
    found = examine(log, KEYS)
    assert found.max_in_flight == 2
    assert found.overlaps == ["k#3 arrived while #2 in flight"]
    assert found.ahead == ["k#3 attempted before #2 was released"]
    assert found.inversions == []  # first acceptances still in order


def test_an_attempt_before_the_earlier_message_was_accepted_is_ahead_of_its_turn():
    # b tried (and failed) while a was still retrying, without overlapping a request of a
    log = [row(1, 2, "a", 1, None, 500), row(3, 4, "b", 2, 1, 500), row(5, 6, "a", 1, None)]
    log += [row(7, 8, "b", 2, 1), row(9, 10, "c", 3, 2)]
    found = examine(log, KEYS)
    assert found.ahead == ["k#2 attempted before #1 was released"]
    assert found.overlaps == [] and found.inversions == []


def test_wrong_headers_and_a_message_never_accepted_are_reported():
    log = [row(1, 2, "a", 1, None), row(3, 4, "b", 2, None), row(5, 6, "c", 4, 2, key="other")]
    found = examine(log, {"k": [("a", 1), ("b", 2), ("c", 3)]})
    assert found.headers == [
        "k#2: previous None (expected 1)",
        "k#3: key 'other', sequence 4 (expected 3)",
    ]
    found = examine([row(1, 2, "a", 1, None), row(5, 6, "c", 3, 1)], KEYS)
    assert found.never_accepted == ["k#2 (b)"]


def test_a_skipped_dead_letter_is_not_expected_and_the_next_names_the_one_before_it():
    log = [row(1, 2, "a", 1, None), row(3, 4, "b", 2, 1, 400), row(5, 6, "c", 3, 1)]
    found = examine(log, KEYS, set_aside={"b"})
    assert (found.never_accepted, found.headers, found.ahead) == ([], [], [])
    assert found.order == {"k": [1, 3]}
    # the key went on before the dead letter's answer was decided: ahead of its turn
    early = [row(1, 2, "a", 1, None), row(3, 6, "b", 2, 1, 400), row(5, 7, "c", 3, 1)]
    assert examine(early, KEYS, set_aside={"b"}).ahead == ["k#3 attempted before #2 was released"]


def test_failed_jobs_names_the_last_exception_of_each_logged_traceback(tmp_path):
    from types import SimpleNamespace

    from tests.faults.ordering_scenarios import failed_jobs

    (tmp_path / "worker-0.log").write_text(
        "05:35:08 Worker w: job j: exception raised while executing (outbox.jobs.deliver)\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "redis.exceptions.ConnectionError: Error 111\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 2, in g\n'
        "redis.exceptions.BusyLoadingError: Redis is loading the dataset in memory\n"
        "outbox wake: Redis reachable again\n"
        "ValueError: not part of a job's traceback\n"
        "05:36:00 Worker w: job k: exception raised while executing (outbox.jobs.deliver)\n"
        "Traceback (most recent call last):\n"
        "KeyError: 'x'\n"
    )
    assert failed_jobs(SimpleNamespace(log_dir=tmp_path)) == {"BusyLoadingError": 1, "KeyError": 1}
