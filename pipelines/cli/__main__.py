"""``python -m pipelines.cli``: the same as the ``scifolio`` command."""

from pipelines.cli import main

raise SystemExit(main())
