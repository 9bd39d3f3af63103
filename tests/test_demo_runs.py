"""txlake demo on all 336,776 real flights, every step (the README's first command): the facts it
claims hold. Apart from tests/test_demo.py so that the longest demo run shares the test workers
with the rest (pytest-xdist's --dist loadfile keeps a file on one worker). The demo runs in a
child process of its own: its Spark stage starts a JVM with the demo's settings, which the Spark
tests that later run on the same test worker must not inherit (they need ``local[2,2]``)."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from test_demo import _close_engines, check, check_serve  # noqa: F401 (_close_engines: the autouse fixture)
from txlake.demo import run_demo
from txlake.demo_spark import delta_unavailable


def run_demo_in_a_child(url: str, **kwargs):
    """``run_demo(url, **kwargs)`` in a spawned process (its own JVM), its DemoResult returned."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_demo, url, **kwargs).result()


def test_demo_on_all_flights(tmp_path):
    url = f"file://{tmp_path}/demo"
    result = run_demo_in_a_child(url, log_path=str(tmp_path / "demo.log"))
    assert result.url == url and result.local_path == f"{tmp_path}/demo"
    check(result, None, 8)
    assert result.records_produced == 336_776
    assert result.worst_routes[0]["origin"] == "EWR" and result.worst_routes[0]["dest"] == "CAE"
    copier = result.copier                     # step 6: a real SIGKILL in the 4th transaction
    batch = 336_776 // 12
    assert (copier.killed_in_transaction, copier.committed_before_kill) == (4, 3 * batch)
    assert (copier.transactions_before_kill, copier.killed_transaction_records, copier.first_exit_status) == (3, batch, -9)
    assert copier.copied_after_restart == 336_776 - 3 * batch
    assert (copier.output_committed, copier.missing, copier.duplicates) == (336_776, 0, 0)
    assert copier.output_in_log == 336_776 + batch      # the killed transaction's records: aborted, in the log
    assert copier.committed_offsets_at_end and copier.ok
    group = result.group                       # step 7: a consumer group, a server SIGKILL, a worker crash
    assert (group.output_committed, group.missing, group.duplicates, group.out_of_order_partitions) == (336_776, 0, 0, 0)
    assert group.committed_before_engine_kill > 0 and group.crashed_worker_open_records > 0
    assert group.workers_seen == 3 and group.committed_offsets_at_end and group.ok
    # steps 6 and 7 ran as confluent-kafka clients of one txlake serve, SIGKILLed and restarted mid-step 7
    assert result.over_the_wire and group.over_the_wire
    assert group.engine_exit_status == -9 and group.committed_after_restart > 0 and group.workers_through_restart
    assert group.crashed_worker_exit_status == -9 and group.crashed_transaction_state == "CompleteAbort"
    spark = result.spark                       # step 9: Spark, DuckDB and the Consumer agree at the LSO
    assert (spark.consumer_committed, spark.duckdb_committed, spark.spark_committed) == (336_776,) * 3
    assert spark.spark_uncommitted == 336_776 + spark.open_records + spark.aborted_records == 336_776 + 150
    assert spark.carriers and sum(c["flights"] for c in spark.carriers) <= 336_776 and spark.ok
    assert spark.table_uri == f"{url}/tables/flights" and spark.table_version >= 0
    missing = delta_unavailable(spark.table_uri)  # Spark over the Delta table, published with the transaction open
    assert (spark.delta_committed, spark.delta_missing) == ((None, missing) if missing else (336_776, ""))
    check_serve(result, None, 8)
