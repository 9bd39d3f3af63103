"""Credentials never reach a command line, a repr or a log line (issue 14, defect 5).

* ``txlake demo`` starts its exactly-once copier as ``python -m txlake.copier -`` with the
  config on the child's stdin: the real child's ``/proc/<pid>/cmdline`` and environment
  hold neither the S3 key nor the secret, and the child still works against the S3
  server (it can only have got the credentials through the pipe).
* ``ClientConfig``, ``ObjectStore`` and the Spark ``ReadOptions`` print secrets as
  ``[redacted]``; no log line of a demo stage prints them.
* A URL carrying credentials is refused with a message that does not show them.
* A copier child that dies on its own is reported with its exit code and stderr.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time

import pytest
from rich.console import Console

from txlake import AdminClient, NewTopic, Producer
from txlake.catalog.redaction import REDACTED, is_secret_key, redact_config, redact_url, url_has_credentials
from txlake.catalog.storage import ObjectStore
from txlake.child_conf import FROM_STDIN, WorkerProcessError, load_conf, start_with_conf
from txlake.config import parse_config
from txlake.engine import registry

SOURCE_ROWS = 40  # flights copied by the demo's copier stage: 4 transactions of 10, the 4th killed


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    registry.close_all()


def _load_flights(conf: dict, rows: int, partitions: int = 2) -> None:
    """The demo's step 1 on a few flights: topic ``flights`` holding them as JSON values."""
    from txlake import demo

    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(demo.TOPIC, partitions)])[demo.TOPIC].result()
    with Producer(conf) as producer:
        producer.produce_arrow(demo.TOPIC, demo.flight_records(demo.flight_table(rows), 1000),
                               key="key", value="value", timestamp="timestamp")


def _read_proc(pid: int, name: str) -> bytes:
    """``/proc/<pid>/<name>`` once the new program's arguments are in place (right after the
    exec the kernel may still show an empty command line for a moment)."""
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            data = f.read()
        if data or time.monotonic() > deadline:
            return data
        time.sleep(0.001)


class _SpawnSpy:
    """Records the command line and environment of every ``txlake.copier`` child the code under
    test starts (``subprocess.Popen``, whichever way it is called), read from /proc right after
    it started, while it runs."""

    def __init__(self, monkeypatch):
        import subprocess

        seen = self.seen = []

        class Popen(subprocess.Popen):
            def __init__(self, args, *a, **kw):
                super().__init__(args, *a, **kw)
                if any("txlake.copier" in str(x) for x in args):
                    seen.append({"pid": self.pid, "cmdline": _read_proc(self.pid, "cmdline"),
                                 "environ": _read_proc(self.pid, "environ"), "alive": self.poll() is None})

        monkeypatch.setattr(subprocess, "Popen", Popen)


def test_demo_copier_gets_s3_credentials_on_stdin_not_on_its_command_line(s3_server, monkeypatch, caplog, tmp_path):
    from txlake import demo

    options = s3_server.storage_options()
    secret, key = options["secret"], options["key"]
    url = f"s3://{s3_server.bucket}/secrets-{os.getpid()}-{id(options)}"
    conf = {"storage.url": url, "storage.options": options}
    _load_flights(conf, SOURCE_ROWS)
    registry.close_all()
    spy = _SpawnSpy(monkeypatch)
    out = io.StringIO()
    caplog.set_level(logging.INFO)  # (DEBUG lines: test_no_log_line_shows_the_secret, in-process)
    log = io.StringIO()   # the demo's log file: the workers' stderr goes there
    res = demo.CopierResult(source_records=SOURCE_ROWS)
    demo._copier_stage(res, url, options, SOURCE_ROWS, Console(file=out, width=200), str(tmp_path), log)

    # the children worked against S3: every flight copied exactly once across a real SIGKILL
    assert res.ok, res
    assert (res.missing, res.duplicates) == (0, 0)
    assert res.output_committed == SOURCE_ROWS and res.killed_in_transaction == 4
    # two real children (the killed worker and its restart), both alive when read
    assert len(spy.seen) == 2 and all(s["alive"] for s in spy.seen)
    for s in spy.seen:
        argv = s["cmdline"].split(b"\0")
        assert argv[1:5] == [b"-P", b"-m", b"txlake.copier", FROM_STDIN.encode()]
        assert secret.encode() not in s["cmdline"] and key.encode() not in s["cmdline"]
        assert secret.encode() not in s["environ"]
    # nothing printed or logged shows the credentials
    assert secret not in out.getvalue() and key not in out.getvalue()
    assert "---- the exactly-once copier" in log.getvalue() and secret not in log.getvalue()
    assert [r.getMessage() for r in caplog.records if secret in r.getMessage() or key in r.getMessage()] == []


def test_no_log_line_shows_the_secret(s3_server, caplog):
    """Every DEBUG line of a produce / consume / DuckDB round trip on S3 (txlake's, s3fs's,
    botocore's) is free of the secret; txlake's own lines of the access key id too (botocore
    shows the key id in each request's Authorization header: S3 does not treat it as secret)."""
    import txlake.duckdb as txduck
    from txlake import Consumer, TopicPartition

    options = s3_server.storage_options()
    secret, key = options["secret"], options["key"]
    conf = {"storage.url": f"s3://{s3_server.bucket}/logs-{os.getpid()}", "storage.options": options}
    caplog.set_level(logging.DEBUG)
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
    with Producer({**conf, "linger.ms": 1}) as producer:
        producer.produce("t", b"v", partition=0)
        assert producer.flush(30) == 0
    c = Consumer({**conf, "auto.offset.reset": "earliest", "group.id": "g"})
    c.assign([TopicPartition("t", 0)])
    assert [m.value() for m in c.consume(10, 5)] == [b"v"]
    c.close()
    con = txduck.connect(conf["storage.url"], options)
    assert con.sql('SELECT count(*) FROM "t"').fetchall() == [(1,)]
    con.close()
    registry.close_all()
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert len({n for n, _ in messages if n.startswith("botocore")}) > 3  # DEBUG lines were captured
    assert [m for _, m in messages if secret in m] == []
    assert [m for n, m in messages if n.startswith("txlake") and key in m] == []


def test_config_and_store_reprs_redact_secrets(s3_server):
    options = {**s3_server.storage_options(), "token": "session-token-1",
               "client_kwargs": {"region_name": "us-east-1", "aws_secret_access_key": "nested-secret"}}
    cfg = parse_config({"storage.url": f"s3://{s3_server.bucket}/x", "storage.options": options,
                        "storage.options.password": "flat-password"}, "producer")
    text = repr(cfg)
    for value in (options["key"], options["secret"], "session-token-1", "nested-secret", "flat-password"):
        assert value not in text and value not in str(cfg)
    assert cfg.storage_options["secret"] == options["secret"]  # only the printing is redacted
    assert f"'secret': '{REDACTED}'" in text and f"'key': '{REDACTED}'" in text
    assert "'region_name': 'us-east-1'" in text and f"'endpoint_url': '{options['endpoint_url']}'" in text
    store = ObjectStore(f"s3://{s3_server.bucket}/x", options)
    assert repr(store) == f"ObjectStore('s3://{s3_server.bucket}/x')"


def test_spark_read_options_repr_redacts_secrets():
    pytest.importorskip("pyspark")
    from txlake.spark_connector.options import OptionError, parse_read_options

    opts = parse_read_options({"storage.url": "s3://b/p", "storage.options.key": "AKIAEXAMPLE",
                               "storage.options.secret": "s3cr3t/value", "subscribe": "t"}, streaming=False)
    assert opts.storage_options == {"key": "AKIAEXAMPLE", "secret": "s3cr3t/value"}
    assert "AKIAEXAMPLE" not in repr(opts) and "s3cr3t" not in repr(opts)
    assert f"storage_options={{'key': '{REDACTED}', 'secret': '{REDACTED}'}}" in repr(opts)
    with pytest.raises(OptionError) as err:  # not JSON: the text is not echoed
        parse_read_options({"storage.url": "s3://b/p", "storage.options": '{"secret": "s3cr3t"', "subscribe": "t"},
                           streaming=False)
    assert "s3cr3t" not in str(err.value) and "storage.options" in str(err.value)


@pytest.mark.parametrize("url,shown", [
    ("s3://AKIAEXAMPLE:abc/def+ghi@bucket/prefix", "s3://[redacted]@bucket/prefix"),
    ("ftp://user:pass@host/path", "ftp://[redacted]@host/path"),
    ("abfs://container@account.dfs.core.windows.net/p", "abfs://container@account.dfs.core.windows.net/p"),
    ("file:///tmp/a:b@c", "file:///tmp/a:b@c"),
    ("s3://bucket/a:b@c", "s3://bucket/a:b@c"),
    ("https://host/p?x=1&sig=abc&sas_token=def", "https://host/p?x=1&sig=[redacted]&sas_token=[redacted]"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown
    assert url_has_credentials(url) == ("[redacted]@" in shown)


def test_secret_keys_follow_one_rule():
    for name in ("key", "secret", "token", "SSECustomerKey", "aws_secret_access_key", "sasl.password",
                 "ssl.key.password", "ssl.keystore.password", "ssl.truststore.password", "sasl.jaas.config",
                 "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret", "Credentials"):
        assert is_secret_key(name), name
    for name in ("endpoint_url", "region_name", "anon", "storage.url", "transactional.id", "client_kwargs"):
        assert not is_secret_key(name), name
    assert redact_config({"storage.options": "key=AKIA,secret=x", "storage.url": "s3://u:p@b"}) == \
        {"storage.options": REDACTED, "storage.url": "s3://[redacted]@b"}


def test_a_url_with_credentials_is_refused_without_showing_them(tmp_path):
    from click.testing import CliRunner

    from txlake.cli import main

    with pytest.raises(ValueError) as err:
        ObjectStore("s3://AKIAEXAMPLE:wJalr/XUtnFEMI@bucket/prefix", {})
    assert "AKIAEXAMPLE" not in str(err.value) and "wJalr" not in str(err.value)
    assert "s3://[redacted]@bucket/prefix" in str(err.value) and "storage options" in str(err.value)
    result = CliRunner().invoke(main, ["--storage", "s3://AKIAEXAMPLE:wJalr/XUtnFEMI@bucket/prefix", "topics", "list"])
    assert result.exit_code == 1, result.output
    assert "AKIAEXAMPLE" not in result.output and "wJalr" not in result.output
    assert "s3://[redacted]@bucket/prefix" in result.output


def test_config_reaches_the_child_on_stdin(tmp_path):
    """The protocol itself: the child reads the config line with load_conf; JSON on the command
    line still works but warns when it holds credentials."""
    conf = {"storage.url": "file:///x", "storage.options": {"secret": "on-the-pipe"}}
    code = "import json, sys; from txlake.child_conf import load_conf; print(json.dumps(load_conf(sys.argv[1])))"
    proc = start_with_conf([sys.executable, "-c", code, FROM_STDIN], conf, stdout=-1, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(out) == conf
    with pytest.warns(UserWarning, match="holds credentials"):
        assert load_conf('{"storage.options": {"secret": "s"}}') == {"storage.options": {"secret": "s"}}
    with pytest.raises(ValueError) as err:
        load_conf('{"secret": "half')
    assert "half" not in str(err.value)


def test_demo_reports_a_copier_that_died_on_its_own(tmp_path):
    """The copier exits 1 (the source holds a record that is not a JSON flight): the demo raises
    naming the process, its exit code and its stderr, instead of narrating a SIGKILL it never sent."""
    from txlake import demo

    conf = {"storage.url": f"file://{tmp_path}/root"}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(demo.TOPIC, 1)])[demo.TOPIC].result()
    with Producer(conf) as producer:
        producer.produce(demo.TOPIC, b"not a flight", partition=0)
        assert producer.flush(30) == 0
    out = io.StringIO()
    with pytest.raises(WorkerProcessError) as err:
        demo._copier_stage(demo.CopierResult(source_records=20), conf["storage.url"], {}, 20, Console(file=out),
                           str(tmp_path), io.StringIO())
    e = err.value
    assert e.returncode == 1 and e.name == "the exactly-once copier"
    assert str(e).startswith(f"the exactly-once copier process (pid {e.pid}) exited with code 1 before it held "
                             "transaction 4 open; its last output on stderr:\n")
    assert 'txlake/copier.py", line' in e.stderr_tail  # the child's own traceback
    assert e.stderr_tail.splitlines()[-1] == "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    assert e.last_stderr_line == e.stderr_tail.splitlines()[-1]
    assert e.headline == (f"the exactly-once copier process (pid {e.pid}) exited with code 1 before it held "
                          "transaction 4 open")
    assert "SIGKILL" not in out.getvalue()


def test_invalid_config_messages_never_echo_a_secret_value():
    """An invalid value of a secret-named property is reported without the value (librdkafka
    redacts its sensitive properties the same way)."""
    from txlake.config import _bad

    err = _bad("storage.options.secret", "s3cr3t-value", "not a str").args[0]
    assert "s3cr3t-value" not in err.str() and '"storage.options.secret"' in err.str()
    assert '"42"' in _bad("linger.ms", 42).args[0].str()   # ordinary values stay visible
