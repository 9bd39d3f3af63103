"""What a new user meets first in the txlake command (issue 15): values produced from a file
arrive as the file holds them, a missing topic is named before any work, empty listings say
so, errors say what failed once, and `topics describe` counts offsets, not records."""

from __future__ import annotations

import json

from tests.test_cli import consume_all, root, run, storage_args  # noqa: F401 - root is a fixture
from tests.test_cli import _close_engines  # noqa: F401 - autouse fixture: closes the engines


def test_csv_values_arrive_as_the_file_holds_them(root, tmp_path):  # noqa: F811
    """pyarrow infers `2024-01-01T00:00:00` as a timestamp and prints it back as
    `2024-01-01 00:00:00`; the record must carry the file's text (and its numbers as numbers)."""
    path = tmp_path / "ev.csv"
    path.write_text("id,at,day,price,code\n"
                    "1,2024-01-01T00:00:00,2024-01-02,1.50,007\n"
                    "2,2024-01-03T04:05:06.789,2024-01-04,2.00,010\n")
    s = storage_args(root)
    run(["topics", "create", "rows", *s])
    run(["topics", "create", "cells", *s])
    run(["produce", "rows", "-f", str(path), "--partition", "0", *s])
    run(["produce", "cells", "-f", str(path), "--key-column", "code", "--value-column", "price",
         "--partition", "0", *s])
    rows = [json.loads(m.value()) for m in consume_all(root, {}, "rows", 1)]
    assert rows == [
        {"id": 1, "at": "2024-01-01T00:00:00", "day": "2024-01-02", "price": 1.5, "code": 7},
        {"id": 2, "at": "2024-01-03T04:05:06.789", "day": "2024-01-04", "price": 2.0, "code": 10},
    ]
    cells = [(m.key(), m.value()) for m in consume_all(root, {}, "cells", 1)]
    assert cells == [(b"007", b"1.50"), (b"010", b"2.00")]


def test_jsonl_timestamp_text_is_kept_and_timestamp_column_converts_text(root, tmp_path):  # noqa: F811
    path = tmp_path / "ev.jsonl"
    path.write_text('{"at": "2024-01-01T00:00:00Z", "v": 1}\n{"at": "2024-01-02T00:00:00+01:00", "v": 2}\n')
    s = storage_args(root)
    run(["topics", "create", "ev", *s])
    run(["produce", "ev", "-f", str(path), "--timestamp-column", "at", "--partition", "0", *s])
    msgs = consume_all(root, {}, "ev", 1)
    assert [json.loads(m.value()) for m in msgs] == [{"at": "2024-01-01T00:00:00Z", "v": 1},
                                                     {"at": "2024-01-02T00:00:00+01:00", "v": 2}]
    assert [m.timestamp()[1] for m in msgs] == [1704067200000, 1704150000000]


def test_produce_to_a_missing_topic_says_so_before_reading(root, tmp_path):  # noqa: F811
    path = tmp_path / "x.csv"
    path.write_text("a\n1\n")
    s = storage_args(root)
    res = run(["produce", "nosuch", "-f", str(path), *s], ok=False)
    assert res.exit_code == 1
    assert res.stderr.strip() == (f"Error: _UNKNOWN_TOPIC: Topic 'nosuch' does not exist in {root}. Create it first: "
                                  "txlake topics create nosuch --partitions N")
    assert "%" not in res.stdout  # no progress bar was started
    assert run(["topics", "list", *s]).stdout == ""


def test_empty_group_listing_says_so(root):  # noqa: F811
    s = storage_args(root)
    run(["topics", "create", "t", *s])
    assert run(["groups", "list", *s]).stdout == f"No consumer groups in {root}.\n"


def test_bad_transactional_id_pattern_says_what_failed_once(root):  # noqa: F811
    s = storage_args(root)
    res = run(["transactions", "list", "--transactional-id-pattern", "(", *s], ok=False)
    assert res.exit_code == 1
    assert res.stderr.count("Failed to list transactions") == 1
    assert res.stderr.startswith("Error: INVALID_REGULAR_EXPRESSION: Failed to list transactions: ")


def test_topics_describe_counts_offsets_not_records(root, tmp_path):  # noqa: F811
    s = storage_args(root)
    run(["topics", "create", "t", *s])
    out = run(["topics", "describe", "t", *s]).stdout
    header = next(line for line in out.splitlines() if "Log start offset" in line)
    assert [c.strip() for c in header.split("┃")] == [
        "Partition", "Log start offset", "High watermark", "LSO", "Offsets", "Segments", "Bytes"]
    assert "control markers and aborted records included" in " ".join(out.split())


def test_topics_list_exclude_internal_drops_only_kafkas_internal_topics(root):  # noqa: F811
    """kafka-topics.sh --exclude-internal drops the internal topics, not every name with '__'."""
    from txlake import Consumer, TopicPartition

    s = storage_args(root)
    run(["topics", "create", "__mine", *s])
    run(["topics", "create", "t", *s])
    c = Consumer({"storage.url": root, "group.id": "g"})
    c.commit(offsets=[TopicPartition("t", 0, 0)], asynchronous=False)   # creates __consumer_offsets
    c.close()
    assert run(["topics", "list", *s]).stdout == "__consumer_offsets\n__mine\nt\n"
    assert run(["topics", "list", "--exclude-internal", *s]).stdout == "__mine\nt\n"
