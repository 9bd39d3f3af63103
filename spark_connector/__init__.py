"""The Spark data source (batch and streaming, read and write) -- arrives with the Spark connector issue.

The committed view it will read is already built by :mod:`txlake.committed_view`.
"""
