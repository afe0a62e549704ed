"""``python -m torch_dataloader_utils.cli``: the ``tdu`` command line."""

from . import main

raise SystemExit(main())
