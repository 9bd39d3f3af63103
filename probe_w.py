import os, time, json
from txlake.spark_connector.source import TxlakeDataSource
from txlake.spark_connector.batch_write import TxlakeBatchWriter
LOG = "/tmp/probe_w.log"
def note(what, **kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({"t": time.time(), "pid": os.getpid(), "what": what, **kw}) + "\n")
class ProbeW(TxlakeDataSource):
    @classmethod
    def name(cls): return "probew"
    def writer(self, schema, overwrite):
        note("writer()"); return PW(dict(self.options), schema, overwrite)
class PW(TxlakeBatchWriter):
    def write(self, it):
        note("write0")
        n = [0]
        def counted():
            first = True
            for b in it:
                if first: note("first batch"); first = False
                n[0] += b.num_rows
                yield b
            note("input done", rows=n[0])
        m = super().write(counted())
        note("write1")
        return m
    def commit(self, messages):
        note("commit0"); super().commit(messages); note("commit1")
