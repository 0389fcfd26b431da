from ltx2_train.cli import main

raise SystemExit(main())
