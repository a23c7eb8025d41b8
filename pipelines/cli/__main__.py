"""`python -m pipelines.cli` = the `scifolio` command."""

from pipelines.cli import main

raise SystemExit(main())
