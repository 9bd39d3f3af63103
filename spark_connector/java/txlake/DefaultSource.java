package txlake;

import java.util.Map;

import org.apache.spark.QueryContext;
import org.apache.spark.sql.AnalysisException;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.catalyst.util.CaseInsensitiveMap;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.DataSourceManager;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.CreatableRelationProvider;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The JVM face of {@code format("txlake")}: it gives batch writes Spark's V1 save path, where
 * the default save mode ErrorIfExists can be accepted as Spark's Kafka sink accepts it, and
 * hands everything else to txlake's Python data source (docs/spark.md, "Writing").
 *
 * <p>Spark resolves {@code format("txlake")} ({@code DataSource.lookupDataSource}) by
 * registered short names first, then by the class names {@code txlake} and
 * {@code txlake.DefaultSource} -- this class, when its jar is on the driver's class path --
 * and only then by Python data source names. So this class takes the name when its jar is
 * loaded, and the Python source keeps the name {@code txlake} too (PySpark's write worker
 * insists on the Python class's own name, DATA_SOURCE_TYPE_MISMATCH); without the jar the
 * Python source (found by PySpark's discovery of {@code pyspark_txlake}) serves the name
 * alone. A {@code DataSourceRegister} short name would not do: some versions of
 * {@code lookupDataSource} refuse a short name that a Python data source also has
 * ({@code foundMultipleDataSources}); Spark 4.3.0's lets the JVM class win.
 *
 * <ul>
 * <li>Reads, streams and streaming writes: {@link #getTable} wraps the Python source's table
 *   ({@link TxlakeTable}); scans and streaming writes are the Python source's own.</li>
 * <li>Batch writes: the wrapped table does not claim BATCH_WRITE, so
 *   {@code DataFrameWriter.save()} falls back to the V1 path in every save mode and calls
 *   {@link #createRelation}, which refuses Overwrite and Ignore with the Kafka sink's message
 *   ({@code KafkaSourceProvider.createRelation}) and, in Append and ErrorIfExists, runs the
 *   Python source's own exactly-once batch write: a {@code save()} in mode Append for which
 *   the table claims BATCH_WRITE, i.e. Spark's V2 append ({@code AppendData}).</li>
 * </ul>
 *
 * <p>Spark creates one instance per lookup, as for {@code PythonDataSourceV2}, which this
 * instance wraps.
 */
public final class DefaultSource implements TableProvider, CreatableRelationProvider {

  /** The Python data source's name ({@code TxlakeDataSource.name()}). */
  static final String PYTHON_NAME = "txlake";

  /**
   * True in a thread while {@link #createRelation} runs the append: the {@code save()} it runs
   * resolves {@code format("txlake")} to this class again, and the tables made for it claim
   * BATCH_WRITE, so that save takes Spark's V2 append of the Python source.
   */
  private static final ThreadLocal<Boolean> APPENDING = ThreadLocal.withInitial(() -> false);

  private PythonDataSourceV2 python;

  /** The Python source {@code txlake} of the active session, as Spark's own lookup makes it. */
  private PythonDataSourceV2 python() {
    if (python == null) {
      requirePythonSource(SparkSession.active().sessionState().dataSourceManager());
      PythonDataSourceV2 source = new PythonDataSourceV2();
      source.setShortName(PYTHON_NAME);
      python = source;
    }
    return python;
  }

  private static void requirePythonSource(DataSourceManager manager) {
    if (!manager.dataSourceExists(PYTHON_NAME)) {
      throw unchecked(analysisError("txlake.DefaultSource (the txlake jar on the driver's class path) found no "
          + "Python data source named 'txlake': PySpark registers it when the Python that runs "
          + "Spark's Python workers (spark.pyspark.python, PYSPARK_PYTHON) has txlake installed "
          + "(its module pyspark_txlake); see docs/spark.md"));
    }
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return python().inferSchema(options);
  }

  @Override
  public Transform[] inferPartitioning(CaseInsensitiveStringMap options) {
    return python().inferPartitioning(options);
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new TxlakeTable(python().getTable(schema, partitioning, properties), APPENDING.get());
  }

  /** As the Python source: Spark passes the input's schema to {@link #getTable} on writes. */
  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  /**
   * Every column type passes: the Python writer checks the columns it uses (key, value, topic,
   * partition, headers) with the Kafka sink's messages and ignores the others, as
   * {@code KafkaWriter.validateQuery} does.
   */
  @Override
  public boolean supportsDataType(DataType dataType) {
    return true;
  }

  /**
   * {@code df.write.format("txlake").save()}: Append and ErrorIfExists (Spark's default) append
   * {@code data} exactly once through the Python source; Overwrite and Ignore are refused before
   * anything runs, with the message of Spark's Kafka sink.
   *
   * @return a relation that is not readable, as the Kafka sink's
   * @throws AnalysisException for Overwrite and Ignore; the Python write's errors as they are
   */
  @Override
  public BaseRelation createRelation(SQLContext sqlContext, SaveMode mode,
                                     scala.collection.immutable.Map<String, String> parameters,
                                     Dataset<Row> data) {
    if (mode == SaveMode.Overwrite || mode == SaveMode.Ignore) {
      throw unchecked(analysisError("Save mode " + mode + " not allowed for txlake. Allowed save modes are "
          + SaveMode.Append + " and " + SaveMode.ErrorIfExists + " (default)."));
    }
    scala.collection.immutable.Map<String, String> options = parameters instanceof CaseInsensitiveMap
        ? ((CaseInsensitiveMap<String>) parameters).originalMap() : parameters;
    APPENDING.set(true);
    try {
      data.write().format(PYTHON_NAME).mode(SaveMode.Append)
          .options(scala.jdk.javaapi.CollectionConverters.asJava(options)).save();
    } finally {
      APPENDING.set(false);
    }
    return new BaseRelation() {
      @Override
      public SQLContext sqlContext() {
        throw new UnsupportedOperationException("BaseRelation from txlake write operation is not usable.");
      }

      @Override
      public StructType schema() {
        throw new UnsupportedOperationException("BaseRelation from txlake write operation is not usable.");
      }
    };
  }

  /**
   * Throws {@code error} from a method that declares no checked exception, as Scala code (Spark's
   * Kafka sink) throws AnalysisException; the {@code throw} at the call site never runs.
   */
  @SuppressWarnings("unchecked")
  static <E extends Throwable> RuntimeException unchecked(Throwable error) throws E {
    throw (E) error;
  }

  /** An AnalysisException with {@code message} and no error class (as Spark's own pre-4.0 ones). */
  static AnalysisException analysisError(String message) {
    return new AnalysisException(message, scala.Option.empty(), scala.Option.empty(), scala.Option.empty(),
        scala.Option.empty(), scala.collection.immutable.Map$.MODULE$.<String, String>empty(), new QueryContext[0]);
  }
}
