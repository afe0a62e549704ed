"""``python -m torch_dataloader_utils``: the ``tdu`` command line."""

from .cli import main

raise SystemExit(main())
