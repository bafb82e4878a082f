from .apps.cli import main

raise SystemExit(main())
