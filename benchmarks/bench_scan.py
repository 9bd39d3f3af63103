"""Scan benchmarks: a full committed scan through the Consumer and through the DuckDB view,
each against a raw DuckDB scan of the same Parquet files.

Run:  .venv/bin/python benchmarks/bench_scan.py [--records 1000000]

* Consumer vs raw DuckDB -> Python rows: both hand every record to Python as objects
  (``Message`` vs a tuple from ``fetchall()``), the fair comparison for a client API.
* DuckDB view vs raw DuckDB -> Arrow: the same engine reading the same files; the view
  adds the catalog's per-partition offset bounds and the control-record filter.
Ratios are "raw time / txlake time" (1.0 = as fast as raw; the goal is >= 0.8).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import duckdb

sys.path.insert(0, os.path.dirname(__file__))
from common import best, fresh_root, machine, records_table  # noqa: E402

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from txlake.catalog.catalog import Catalog  # noqa: E402
from txlake.catalog.storage import ObjectStore  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402

PARTITIONS = 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.records
    url = fresh_root()
    with AdminClient({"storage.url": url}) as admin:
        admin.create_topics([NewTopic("scan", PARTITIONS)])["scan"].result()
    p = Producer({"storage.url": url})
    p.produce_arrow("scan", records_table(n))
    p.close()
    close_all()
    store = ObjectStore(url)
    files = sorted({store.fs_path(s.path) for part in Catalog.open(store).state.topics["scan"].partitions
                    for s in part.segments})
    con = duckdb.connect()
    results: dict[str, float] = {}

    def raw_rows():
        rows = con.execute(f"SELECT key, value, \"offset\" FROM read_parquet({files!r})").fetchall()
        assert len(rows) == n

    def raw_arrow():
        t = con.execute(f"SELECT key, value, \"offset\" FROM read_parquet({files!r})").to_arrow_table()
        assert t.num_rows == n

    def consumer_scan():
        c = Consumer({"storage.url": url, "auto.offset.reset": "earliest"})
        c.assign([TopicPartition("scan", i) for i in range(PARTITIONS)])
        got = 0
        while got < n:
            got += len(c.consume(10_000, 5))
        c.close()
        close_all()

    results["raw_duckdb_rows_s"] = best(raw_rows)
    results["raw_duckdb_arrow_s"] = best(raw_arrow)
    results["consumer_s"] = best(consumer_scan)
    results["consumer_ratio_vs_raw_rows"] = results["raw_duckdb_rows_s"] / results["consumer_s"]
    try:
        from txlake.duckdb import connect as lake_connect
    except ImportError:
        lake_connect = None
    if lake_connect is not None:
        view = lake_connect(url)

        def view_arrow():
            t = view.execute('SELECT key, value, "offset" FROM scan').to_arrow_table()
            assert t.num_rows == n

        results["duckdb_view_arrow_s"] = best(view_arrow)
        results["duckdb_view_ratio_vs_raw_arrow"] = results["raw_duckdb_arrow_s"] / results["duckdb_view_arrow_s"]
    print(f"# scan benchmarks ({n:,} records, 100-byte values, {PARTITIONS} partitions, {len(files)} objects; {machine()})")
    for k, v in results.items():
        print(f"{k:36s} {v:10.3f}")


if __name__ == "__main__":
    main()
