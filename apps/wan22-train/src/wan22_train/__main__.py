from wan22_train.cli import main

raise SystemExit(main())
