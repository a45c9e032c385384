from deltaforge.cli import main

raise SystemExit(main())
