from mm_trainer.cli import main

raise SystemExit(main())
