from deltaforge.launch import main

raise SystemExit(main())
