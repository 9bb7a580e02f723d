from torchinferno.cli.main import main

raise SystemExit(main())
