from draftheads.cli import main

raise SystemExit(main())
