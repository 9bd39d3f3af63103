package txlake;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The Python source's table ({@code PythonTable}), without the BATCH_WRITE capability except
 * in the append that {@link DefaultSource#createRelation} runs: scans (batch and micro-batch)
 * and writes are the Python table's own; a batch {@code save()} of a table without
 * BATCH_WRITE takes Spark's V1 path ({@code DataFrameWriter.saveInternal}), i.e.
 * {@link DefaultSource#createRelation}.
 */
final class TxlakeTable implements SupportsRead, SupportsWrite {

  private final Table python;
  private final boolean batchWrite;

  /** @param batchWrite whether to keep the Python table's BATCH_WRITE (see DefaultSource) */
  TxlakeTable(Table python, boolean batchWrite) {
    this.python = python;
    this.batchWrite = batchWrite;
  }

  @Override
  public String name() {
    return python.name();
  }

  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return python.schema();
  }

  @Override
  public Column[] columns() {
    return python.columns();
  }

  @Override
  public Transform[] partitioning() {
    return python.partitioning();
  }

  @Override
  public Map<String, String> properties() {
    return python.properties();
  }

  @Override
  public Set<TableCapability> capabilities() {
    Set<TableCapability> capabilities = EnumSet.noneOf(TableCapability.class);
    capabilities.addAll(python.capabilities());
    if (!batchWrite) {
      capabilities.remove(TableCapability.BATCH_WRITE);
    }
    return capabilities;
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return ((SupportsRead) python).newScanBuilder(options);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    return ((SupportsWrite) python).newWriteBuilder(info);
  }
}
