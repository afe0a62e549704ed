"""Lance datasets read by path (the ``lance`` extra: pylance): the table kind (`table`), its
format (`format`) and how a dataset is opened at a version (`opening`).

Importing this package imports no pylance: it is imported when a dataset is read. A dataset is
read with ``create_dataloader("data/train.lance", format="lance", version=7)``.
"""

from .opening import INSTALL_HINT

__all__ = ["INSTALL_HINT"]
