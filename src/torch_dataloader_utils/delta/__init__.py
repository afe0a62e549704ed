"""Delta Lake tables read by path (the ``delta`` extra: deltalake and pyroaring): the table kind
(`table.DeltaTables`, registered as ``format="delta"``), its log read through deltalake
(`log`), deletion vectors (`actions`, decoded by `sources.deletion_vectors`), column mapping
(`mapping`), file pruning by statistics and partition values (`pruning`) and its format.

Importing this package imports no deltalake: the registry imports `table` when a Delta table is
read, and deltalake is imported when a table is opened.
"""

INSTALL_HINT = "pip install 'torch-dataloader-utils[delta]'"

__all__ = ["INSTALL_HINT"]
